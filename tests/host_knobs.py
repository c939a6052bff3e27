"""What a sandbox escape test writes: the host kernel settings a root escape goes through."""

from __future__ import annotations

from pathlib import Path

# Host kernel settings a root escape goes through; a sandbox writes each its current value back (a
# regression would then change nothing), and "h" (help) to sysrq-trigger.
KNOBS = ["/proc/sys/vm/swappiness", "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/randomize_va_space",
         "/proc/sys/fs/suid_dumpable", "/proc/sys/kernel/panic", "/proc/sysrq-trigger"]


def knob_writes() -> tuple[str, int]:
    """A shell line writing every knob this kernel has, and how many there are."""
    present = [knob for knob in KNOBS if Path(knob).exists()]
    values = {knob: "h" if knob.endswith("trigger") else Path(knob).read_text().strip() for knob in present}
    return "; ".join(f"printf '%s' '{value}' > {knob} && echo WROTE {knob}" for knob, value in values.items()), \
        len(present)
