"""Where things are, for tests at any depth of the tree: the repository, the tests,
and the test models gathered under tests/models/."""

from pathlib import Path

__all__ = ["EXAMPLES", "ROOT", "TESTS", "TEST_MODELS"]

ROOT = Path(__file__).resolve().parent.parent.parent
TESTS = ROOT / "tests"
TEST_MODELS = TESTS / "models"
EXAMPLES = ROOT / "examples"
