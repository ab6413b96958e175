"""ait: AI Trains AI. An agent writes an RL training job; it is scored by measured uplift."""

__version__ = "0.1.0"
