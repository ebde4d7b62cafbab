import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ranks_suite(name: str) -> str:
    """Path of a rank-side suite in tests/ranks/."""
    return os.path.join(ROOT, "tests", "ranks", name)


def pytest_configure(config):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config.addinivalue_line("markers", "slow: long-running (extended runs only)")
