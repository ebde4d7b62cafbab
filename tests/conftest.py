import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ranks_suite(name: str) -> str:
    """Path of a rank-side suite in tests/ranks/."""
    return os.path.join(ROOT, "tests", "ranks", name)


def pytest_configure(config):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config.addinivalue_line("markers", "slow: long-running (extended runs only)")


# -- the exercises' grader: which tree the exercise tests import (tests/test_exercises.py) ------


def pytest_addoption(parser):
    parser.addoption(
        "--impl",
        default="solutions",
        help="the exercise tests run against 'solutions' (default), 'exercises', or a folder",
    )


@pytest.fixture(scope="session")
def exercise_impl(request):
    """The folder of exNN_*.py files under test; the multi-rank suite reads it from the
    environment (the harness passes os.environ to the ranks)."""
    from minipar import exercises

    folder = str(exercises.tree(request.config.getoption("--impl")))
    os.environ["MINIPAR_EXERCISES_IMPL"] = folder
    return folder
