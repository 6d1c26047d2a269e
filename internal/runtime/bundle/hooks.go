package bundle

// The runtime's helpers run in the server, or as the hidden `agentbox
// __hook <name>` subcommand (Config.HookBinary) where another process is
// needed: an OCI hook, or a process inside a sandbox's user namespace,
// which a multi-threaded Go program cannot enter (internal/runtime/nsjoin
// runs those before the Go runtime starts).

// HoldHook names the hook that only waits for its stdin to close: a
// process to make a user namespace with, whose id mapping an idmapped
// mount takes. Only internal/runtime/nsjoin's constructor runs it.
const HoldHook = "hold"
