"""Chat formats: one renderer per format renders messages and reads a reply back into (content, tool calls).

The lowest layer of ait besides the contract: the agent's policies (ait.policy), the inner trainer
(ait.train), the hidden eval (ait.evals) and the probe all import it, and it imports none of them, so
every side reads a model's turns through one parser without an import cycle. Nothing is imported here:
`import ait.chat.types` (the families do, for ToolCall) must stay cheap.

- types.py: ToolCall, the one tool-call type (harness, policies, families' tools, rollouts).
- parse.py: reading calls out of replies (JSON scanning, call objects, schema echoes; the trainer's
  strict bare-JSON reading and the agent's lenient salvage as options of one module).
- renderers.py: HFRenderer (a tokenizer's chat template + TRL's response parser) and OpenAIRenderer
  (the chat-completions wire format), behind the Renderer protocol.
"""
