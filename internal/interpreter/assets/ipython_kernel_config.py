# agentbox code interpreter: configuration of Python contexts' kernels.
c = get_config()  # noqa: F821
# Tracebacks go to agents and logs as plain text: no ANSI colour codes.
c.InteractiveShell.colors = "NoColor"
# No history database: many kernels share the profile, and nothing reads it.
c.HistoryManager.hist_file = ":memory:"
