"""The README's quick start (issue 56): two commands, the first right for the machine most
students have (no GPU: the CPU build of torch, not pip's multi-GB CUDA build), the GPU way said
beside it rather than after the download."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def quick_start() -> tuple[list[str], str]:
    """(the commands of the quick start's block, the text after the block)."""
    section = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    _, block, after = section.split("```", 2)
    return block.removeprefix("bash").strip().splitlines(), after.split("```", 1)[0]


def test_quick_start_installs_the_cpu_torch_first_in_two_commands():
    commands, after = quick_start()
    assert len(commands) == 2, commands  # the two-command promise
    first = commands[0].split(" && ")
    assert first == [CPU_TORCH, 'pip install -e ".[dev]"', "minipar tour"], commands[0]
    assert commands[1] == "python -m pytest -q"  # what CI runs
    assert CPU_TORCH.split(" ", 3)[3] in (ROOT / ".ci" / "run").read_text()  # CI's own index
    assert after.lstrip().startswith("With an NVIDIA GPU, start the first command at `pip install")
