"""Conformance with the real Hermes Agent (issue 19), checked against the oracle dump that
scripts/hermes_oracle.sh makes from hermes-agent in its own venv (see conftest.py)."""
