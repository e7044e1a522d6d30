"""Imported first in the fork server (see fork_server.start_fork_server).

It names the process in ps/top, and makes it ignore SIGTERM: systemd
(KillMode=control-group) and init shims send SIGTERM to every process of the
group, and a fork server that died of it would take every worker with it
(they die with their parent), killing them mid-message instead of letting
the supervisor stop them in order.  It still exits when the supervisor does.
"""

import signal

import setproctitle

setproctitle.setproctitle("marshal-workers: fork server")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
