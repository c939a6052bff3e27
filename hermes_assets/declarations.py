"""Problems of the runs file, shown in the Dagster UI on the run they concern (issue 18: a bad or
conflicting run entry is reported on that run alone; every other run keeps loading).

Each problem becomes the asset `<label>/declaration` in the asset group `<label>`:
- `<label>` is the entry's run name when it is a valid one (so a conflicting saved run shows its
  problem inside its own group, beside its assets), else `runs_file_entry_<n>` for the n-th entry,
  or `runs_file` for a problem of the whole file (unreadable YAML, not a list, file missing);
- its description and its `problem` metadata hold the message (file, entry, field, what is wrong);
- materializing it fails with that message (`dg.Failure`), so "Materialize" says what to fix.
Problems sharing a label are one asset listing them all. Each problem is also logged once as a
warning when the code location loads.
"""

from collections import defaultdict

import dagster as dg

from hermes_core.batch.recipe import RUN_NAME
from hermes_assets.metadata import catalog
from hermes_assets.runs_file import RunsFileProblem

DECLARATION = "declaration"
WHOLE_FILE = "runs_file"
FIX = ("Fix the runs file, then reload the code location (Deployment → Reload, or the reload button "
       "of the code location).")


def problem_label(problem: RunsFileProblem) -> str:
    """The group (and key prefix) the problem is shown in."""
    if problem.run_name is not None and RUN_NAME.match(problem.run_name):
        return problem.run_name
    return f"runs_file_entry_{problem.entry}" if problem.entry is not None else WHOLE_FILE


def declaration_key(label: str) -> dg.AssetKey:
    return dg.AssetKey([label, DECLARATION])


def _declaration_asset(label: str, problems: list[RunsFileProblem]) -> dg.AssetsDefinition:
    message = "\n".join(map(str, problems))
    first = problems[0]

    @dg.asset(key=declaration_key(label), group_name=label, **catalog("input", "yaml"),
              description=f"{message}\n\n{FIX}",
              metadata={
                  "problem": dg.MetadataValue.text(message),
                  "runs_file": dg.MetadataValue.path(str(first.file)),
                  "entry": ", ".join(sorted({str(p.entry) for p in problems if p.entry is not None})) or "whole file",
                  "field": ", ".join(dict.fromkeys(p.field for p in problems if p.field)) or "-",
              })
    def declaration() -> None:
        raise dg.Failure(description=f"{message}\n{FIX}", metadata={"problem": dg.MetadataValue.text(message)})

    return declaration


def build_declaration_assets(problems: list[RunsFileProblem]) -> list[dg.AssetsDefinition]:
    """One failing `declaration` asset per label that has problems."""
    by_label: dict[str, list[RunsFileProblem]] = defaultdict(list)
    for problem in problems:
        by_label[problem_label(problem)].append(problem)
    return [_declaration_asset(label, found) for label, found in sorted(by_label.items())]


def log_problems(problems: list[RunsFileProblem]) -> None:
    """One warning per problem in the code location's log (`dagster dev`'s output)."""
    logger = dg.get_dagster_logger("runs_file")
    for problem in problems:
        logger.warning("runs file problem, shown on %s: %s", declaration_key(problem_label(problem)).to_user_string(),
                       problem)
