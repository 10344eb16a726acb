"""`pip install nemo-muon[...]` beside NGC 26.08's stack installs nemo-muon and changes none of the stack's
distributions: the check of tests/container_stack/test_install_beside_container.py, run against this environment."""

from tests.container_stack.test_install_beside_container import (  # noqa: F401 - collected here, in this environment
    source,
    test_pip_install_changes_no_distribution_of_the_stack,
)
