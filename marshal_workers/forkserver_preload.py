"""Imported first in the fork server (see Supervisor._start_fork_server): names the process in ps/top."""

import setproctitle

setproctitle.setproctitle("marshal-workers: fork server")
