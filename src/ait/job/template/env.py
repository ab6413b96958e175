"""Your environment: see INSTRUCTIONS.md for the surface the loader checks."""

SYSTEM_PROMPT = ""


class Environment:
    def reset(self, info: dict) -> None:
        self.info = info


def build_dataset(n: int, seed: int) -> list[dict]:
    raise NotImplementedError("return n rows {'prompt', 'answer', 'info'}")


REWARD_FUNCS = []
