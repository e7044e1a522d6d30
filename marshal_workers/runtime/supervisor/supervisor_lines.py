"""The supervisor's first and last log lines, and its /healthz verdict.  Pure: values in, text out."""

from __future__ import annotations

from dataclasses import dataclass

from marshal_workers.core.config import SETTINGS, Settings
from marshal_workers.handlers.app import App

# Shown in the start-up line whatever their value; other settings only where they differ from the default.
_ALWAYS_SHOWN = ("coordination_topic", "heartbeat_interval", "balance", "max_partitions", "shutdown_timeout")
_NEVER_SHOWN = ("group", "brokers", "client_id", "processes")  # processes: shown as the count in effect


@dataclass(frozen=True)
class StartUpTimes:
    """Where a supervisor's start-up went, in seconds: what a slow restart is asked about first."""

    imports: float | None  # the interpreter, the imports and the application's module; None: not known (no /proc)
    coordination_log: float  # the coordinator: its topic checked, the log read to its end, its producer ready
    rest: float  # the fork server started, the components built, the first look at the topics
    # The CPU the process used meanwhile (all its threads): far less than the seconds above is a start-up that
    # waited, for a core on a loaded machine or for the broker, not one that worked.  None: not known.
    cpu: float | None = None

    def text(self) -> str:
        total = (self.imports or 0.0) + self.coordination_log + self.rest
        imports = "" if self.imports is None else f"interpreter and imports {self.imports:.2f}s, "
        since = "" if self.imports is None else " of the process"
        cpu = "" if self.cpu is None else f"; {self.cpu:.2f} CPU-s"
        return (
            f"up in {total:.2f}s{since} ({imports}reading the coordination log {self.coordination_log:.2f}s, "
            f"the rest {self.rest:.2f}s{cpu})"
        )


def start_line(
    app: App, app_path: str, settings: Settings, client: str, instance: str, times: StartUpTimes | None = None
) -> str:
    """The start-up line: the effective settings (option, environment, file or App(...)), not App's own arguments,
    and where the start-up's time went."""
    topics = [t for t in app.topics if not app.handlers[t].shared]
    shared = [t for t in app.topics if app.handlers[t].shared]
    handled = f"topics {', '.join(topics) or '-'}" + (f"; shared {', '.join(shared)}" if shared else "")
    defaults = Settings(client_id=settings.client_id)
    shown = [
        f"{name}={_setting_text(name, getattr(settings, name))}"
        for name in SETTINGS
        if name not in _NEVER_SHOWN and (name in _ALWAYS_SHOWN or getattr(settings, name) != getattr(defaults, name))
    ]
    if shared:
        shown.append(f"processes={settings.shared_processes}")
    return (
        f"supervisor {client}/{instance} running {app_path} ({handled}) in group {settings.group} "
        f"on {settings.brokers}: {', '.join(shown)}" + ("" if times is None else f"; {times.text()}")
    )


def _setting_text(name: str, value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}s"  # every float setting is a duration
    if name == "max_memory_per_worker" and isinstance(value, int) and value:
        return f"{value / 2**20:g}MB"
    return str(value)


def stop_line(released: int, seconds: float, exit_code: int, workers_killed: bool, not_confirmed: int = 0) -> str:
    """The last line of a supervisor that stopped by releasing its partitions (``not_confirmed``: of those
    releases, the ones whose write failed)."""
    what = f"released {released} partition{'' if released == 1 else 's'}"
    if exit_code == 0 and not workers_killed and not not_confirmed:
        return f"stopped cleanly: {what} at {'its offset' if released == 1 else 'their offsets'} in {seconds:.1f}s"
    killed = "; workers were killed and released at their last progress" if workers_killed else ""
    lapsing = (
        f"; {not_confirmed} of the releases not confirmed (Kafka did not answer): those partitions go to another"
        " member when their lease runs out (2*HB), from their last confirmed heartbeat, and what was handled since"
        " is handled again"
        if not_confirmed
        else ""
    )
    code = f" with exit code {exit_code}" if exit_code else ""
    return f"stopped{code}: {what} in {seconds:.1f}s{killed}{lapsing}"


def loop_health(
    tick_age_s: float, heartbeat_s: float, last_confirmed: float, last_failed: float, phase: str
) -> tuple[bool, dict[str, object]]:
    """/healthz: healthy while the loop ticked within an HB and the last coordination write was confirmed, not
    failed (``last_confirmed``, ``last_failed``: monotonic times of the latest of each)."""
    confirmed = last_confirmed >= last_failed
    detail = {"loop_tick_age_s": round(tick_age_s, 3), "last_write_confirmed": confirmed, "phase": phase}
    return tick_age_s < heartbeat_s and confirmed, detail
