import pytest

# The shared checks are plain assert statements: let pytest rewrite them for informative failures.
pytest.register_assert_rewrite("tests.families.checks")
