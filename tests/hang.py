"""How long a test waits for what it does not control (a child process, a server, a browser) before it
calls it a hang. Tests wait for an event (a request arrives, a status is reached, a process ends); this
bound only ends a wait that would otherwise never end. It is generous because the suite must pass on a
busy machine: beside `stress-ng --cpu 8` on 2 cores (load 50), one `tether` start-up took over 60 s."""

HANG = 600.0
