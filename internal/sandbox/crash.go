package sandbox

// Crash points: every operation that changes state names its steps, and the
// hidden serve flag --test-crash-after=<operation>/<step> kills the server
// right after one of them (internal/crashpoint). The startup Reconcile must
// then find the old state or the new one, never a half, and nothing leaked.
//
// The start paths are the pipelines of pipeline.go: their runner calls the
// hook after every step, under the path's name (create, restore, claim,
// fork, resume, build). The other operations call it between their steps.

// Steps of a kill (destroy): each is idempotent, so Reconcile finishes an
// interrupted one.
const (
	KillPersisted       = "persist killing"
	KillContainerGone   = "delete container"
	KillNetworkDetached = "detach network"
	KillRowDeleted      = "delete row"
)

// Steps of a snapshot (and of a fork's own hidden snapshot).
const (
	SnapshotPersisted = "persisted" // row "snapshotting"
	SnapshotCaptured  = "captured"  // image and layer copy in the temporary dir
	SnapshotPublished = "published" // renamed into place: it exists
	SnapshotCommitted = "committed" // row back to "running"
)

// A fork is its own hidden snapshot of the parent (the snapshot's steps,
// named forkStep(step) under the operation "fork"), then one start
// pipeline per copy (the "fork" path), then the snapshot's release: from
// then on it goes with the last copy that runs on it.
const ForkSnapshotReleased = "release snapshot"

// forkStep names a step of a fork's own snapshot.
func forkStep(snapshotStep string) string { return "snapshot " + snapshotStep }

// snapshotSteps lists a snapshot's steps, in order.
func snapshotSteps() []string {
	return []string{SnapshotPersisted, SnapshotCaptured, SnapshotPublished, SnapshotCommitted}
}

// Steps of a cluster move on this server's side (migrate.go): the node
// agent exporting a paused sandbox ("move-out") and the one importing it
// ("move-in"), whose restore then runs the "restore" pipeline. The node
// agents' own steps around them are in internal/kube (move.go).
const (
	OpMoveOut        = "move-out"
	OpMoveIn         = "move-in"
	MoveLayersCopied = "copy layers"  // base layers in the staging dir
	MoveImageOut     = "export image" // memory image and writable layer staged
	MoveImageFetched = "fetch image"  // the image downloaded, checked and sealed in a temporary dir
	MoveImagePlaced  = "place image"  // renamed into place as the sandbox's hidden snapshot
)

// MoveOutSteps and MoveInSteps list the crash points of the manager's side
// of a move, in order; a move-in continues with the restore pipeline's.
func MoveOutSteps() []CrashStep {
	return []CrashStep{{OpMoveOut, MoveLayersCopied}, {OpMoveOut, MoveImageOut}}
}

// MoveInSteps: see MoveOutSteps.
func MoveInSteps() []CrashStep {
	out := []CrashStep{{OpMoveIn, MoveImageFetched}, {OpMoveIn, MoveImagePlaced}}
	for _, s := range restoreSnapshot() {
		out = append(out, CrashStep{"restore", s.name})
	}
	return out
}

// CrashStep is one point a crash-safety test can crash the server at.
type CrashStep struct {
	Op   string // operation (a pipeline's path, or kill, snapshot, pause, resume)
	Step string
}

// String is the value of --test-crash-after for the point.
func (c CrashStep) String() string { return c.Op + "/" + c.Step }

// CrashSteps lists every crash point of every operation, in order.
func CrashSteps() []CrashStep {
	var out []CrashStep
	add := func(op string, steps ...string) {
		for _, s := range steps {
			out = append(out, CrashStep{op, s})
		}
	}
	names := func(p pipeline) []string {
		var n []string
		for _, s := range p {
			n = append(n, s.name)
		}
		return n
	}
	add("create", names(coldStart())...)
	add("restore", names(restoreSnapshot())...)
	add("claim", names(claimPooled())...)
	add("resume", names(resumeFiles())...)
	add("build", names(buildStep())...)
	add("snapshot", snapshotSteps()...)
	for _, s := range snapshotSteps() {
		add("fork", forkStep(s))
	}
	add("fork", names(restoreSnapshot())...)
	add("fork", ForkSnapshotReleased)
	add("kill", KillPersisted, KillContainerGone, KillNetworkDetached, KillRowDeleted)
	// Pause (pause.go) and memory resume, a pipeline path whose row and
	// restore steps also keep their older names.
	add("pause", "persisted", "checkpointed")
	add("resume", "persisted", "restored")
	add("resume-memory", names(resumeMemory())...)
	return out
}
