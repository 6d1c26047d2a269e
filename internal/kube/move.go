package kube

import (
	"context"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// A move of a suspended Sandbox between node agents is four ordered lists
// of named steps, each step idempotent, so an agent that crashes after any
// of them finishes the move when it starts again (or another agent does):
//
//	op        agent               steps
//	move-out  the Sandbox's node  copy layers, export image (sandbox manager), upload, record, drop older
//	node-lost the live agent      mark (Ready=False NodeLost), before any rebind
//	move      the live agent      rebind (its node is lost and the image is stored)
//	move-in   the new node        fetch image, place image (sandbox manager), the restore
//	                              pipeline (as "restore/<step>"), restore, drop image, clear record
//
// The hidden serve flag --test-crash-after=<op>/<step> kills the agent right
// after one of them (internal/crashpoint); e2e/kube's crash table does so
// for every step.
const (
	OpMove = "move"

	// move-out: the sealed image is in the object store, under a prefix
	// named by the Sandbox's generation (a retry overwrites it).
	MoveUpload = "upload"
	// move-out: the Sandbox's annotation names the image: from here any
	// agent may restore it.
	MoveRecord = "record"
	// move-out: the images of earlier suspensions are deleted (also those
	// an earlier pass uploaded and died before recording).
	MoveDropOlder = "drop older"
	// OpNodeLost is a live agent marking the Sandboxes of a node whose
	// agent let its Lease expire; a Sandbox whose image is stored is
	// rebound (move/rebind) only on a pass after its mark is written.
	OpNodeLost = "node-lost"
	// node-lost: the Sandbox's Ready condition says NodeLost.
	NodeLostMark = "mark"

	// move: status.nodeName names the live agent.
	MoveRebind = "rebind"
	// move-in: the sandbox runs here under its own id, marked with the
	// image's prefix so a retry finds it instead of restoring twice.
	MoveRestore = "restore"
	// move-in: the stored objects are deleted, every generation's.
	MoveDropImage = "drop image"
	// move-in: the annotation is removed.
	MoveClearRecord = "clear record"
)

// moveStep is one named step of a move.
type moveStep struct {
	name string
	run  func(ctx context.Context) error
}

// runMove runs steps in order and stops at the first error; after each
// step that succeeds, the test crash switch may kill the agent.
func (b reconcilerBase) runMove(ctx context.Context, op string, steps []moveStep) error {
	for _, s := range steps {
		if err := s.run(ctx); err != nil {
			return err
		}
		b.cfg.Crash.After(op, s.name)
	}
	return nil
}

// stepNames lists the steps' names in order.
func stepNames(steps []moveStep) []string {
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = s.name
	}
	return out
}

// MoveCrashSteps lists every crash point of a move, in the order a move
// reaches them: the sandbox manager's and the agents' own.
func MoveCrashSteps() []sandbox.CrashStep {
	var r sandboxReconciler
	var out []sandbox.CrashStep
	add := func(op string, steps []string) {
		for _, s := range steps {
			c := sandbox.CrashStep{Op: op, Step: s}
			// The agent's export step ends where the manager's does.
			if len(out) == 0 || out[len(out)-1] != c {
				out = append(out, c)
			}
		}
	}
	for _, c := range sandbox.MoveOutSteps() {
		add(c.Op, []string{c.Step})
	}
	add(sandbox.OpMoveOut, stepNames(r.storeSteps(&storeRun{})))
	add(OpNodeLost, []string{NodeLostMark})
	add(OpMove, []string{MoveRebind})
	out = append(out, sandbox.MoveInSteps()...)
	add(sandbox.OpMoveIn, stepNames(r.restoreSteps(&restoreRun{})))
	return out
}
