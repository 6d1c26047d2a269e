package benchmark

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// imageBytes is the size of every file under dir: what a dump wrote there.
func imageBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

// dirtyTracking asks CRIU whether this kernel tracks written pages (soft
// dirty bits), which incremental dumps (--track-mem, pre-dump, parent
// images) need; without it every dump writes all memory again.
func dirtyTracking(ctx context.Context, criu string) (bool, string) {
	out, err := exec.CommandContext(ctx, criu, "check", "--feature", "mem_dirty_track").CombinedOutput()
	if err != nil {
		return false, "CRIU: " + criuMessage(lastLine(string(out)))
	}
	return true, ""
}

// incrementalRows prints the bytes each pause wrote against the first (a
// full dump) and the later pauses' time against the first's: a pause of a
// resumed sandbox writes only changed pages when dumps are incremental.
func incrementalRows(w io.Writer, mb int, written []int64, pause []time.Duration, tracking bool, why string) {
	if len(written) < 2 || len(pause) < 2 {
		return
	}
	state := "incremental dumps available"
	if !tracking {
		state = "full dumps: " + why
	}
	later := written[1:]
	var sum int64
	for _, b := range later {
		sum += b
	}
	avg := sum / int64(len(later))
	fmt.Fprintf(w, "pause %d MB: bytes written, later pauses (after a resume) against the first, a full dump (%s)\t%s\t%s\t%.2fx\n",
		mb, state, mib(avg), mib(written[0]), float64(avg)/float64(max(written[0], 1)))
	fmt.Fprintf(w, "pause %d MB: later pauses' time against the first (p50)\t%s\t%s\t%s\n",
		mb, round(pct(pause[1:], 50)), round(pause[0]), ratio(pct(pause[1:], 50), pause[0]))
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// criuMessage drops CRIU's "Warn  (criu/cr-check.c:824): " source prefix.
func criuMessage(line string) string {
	if i := strings.Index(line, "): "); i >= 0 && strings.Contains(line[:i], "(criu/") {
		return line[i+3:]
	}
	return line
}
