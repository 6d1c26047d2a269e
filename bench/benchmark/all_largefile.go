package benchmark

import (
	"context"
	"fmt"
)

// LargeFileTarget is the large-file rows' number in the table.
const LargeFileTarget = 9

// LargeFileBoundKB bounds the server's peak RSS growth and envd's peak RSS
// during a large transfer: a whole body held in memory would take the
// file's size.
const LargeFileBoundKB = 160 << 10

// largeFileRows is target 9: a large file (AllConfig.LargeFileMB, default
// 5 GiB) up and down through the official e2b JS SDK, each way's rate
// against writing and reading the same bytes on the host's disk, and the
// server's and envd's peak RSS held to LargeFileBoundKB.
func largeFileRows(ctx context.Context, a *allRun) []TargetRow {
	return LargeFileRows(ctx, LargeFileConfig{APIURL: a.cfg.APIURL, APIKey: a.cfg.APIKey, Template: a.cfg.Template,
		SizeMB: a.cfg.LargeFileMB, JSDir: a.cfg.JSDir, ServerPID: a.cfg.ServerPID, FloorDir: a.cfg.DataDir})
}

// LargeFileRows measures one large-file round trip as table rows.
func LargeFileRows(ctx context.Context, cfg LargeFileConfig) []TargetRow {
	if cfg.SizeMB <= 0 {
		cfg.SizeMB = 5120
	}
	if cfg.ServerPID == 0 {
		cfg.ServerPID = listenerPID(cfg.APIURL)
	}
	if cfg.JSDir == "" {
		cfg.JSDir = "e2e/js"
	}
	up, down, srv, envd := largeFileFigures(cfg.SizeMB)
	r, err := LargeFile(ctx, cfg)
	if err != nil {
		return []TargetRow{failed(LargeFileTarget, up, err), failed(LargeFileTarget, down, err), failed(LargeFileTarget, srv, err), failed(LargeFileTarget, envd, err)}
	}
	return LargeFileResultRows(cfg, r)
}

// LargeFileResultRows are the table rows of a measured round trip r.
func LargeFileResultRows(cfg LargeFileConfig, r LargeFileResult) []TargetRow {
	up, down, srv, envd := largeFileFigures(cfg.SizeMB)
	rate := func(figure string, v, floor float64) TargetRow {
		return TargetRow{Target: LargeFileTarget, Figure: figure, Value: fmt.Sprintf("%.0f MB/s", v), Floor: fmt.Sprintf("%.0f MB/s", floor),
			Ratio: v / floor, Goal: "streamed", Met: true}
	}
	mem := func(figure string, kb int64) TargetRow {
		row := TargetRow{Target: LargeFileTarget, Figure: figure, Value: fmt.Sprintf("%d MiB", kb>>10), Floor: fmt.Sprintf("%d MiB", LargeFileBoundKB>>10),
			Ratio: float64(kb) / LargeFileBoundKB, Goal: "≤ bound", Met: kb > 0 && kb <= LargeFileBoundKB}
		if kb == 0 {
			row.Err = "not measured (no server pid, or no envd status)"
		}
		return row
	}
	rows := []TargetRow{rate(up, r.Rate(r.Up), r.Rate(r.FloorUp)), rate(down, r.Rate(r.Down), r.Rate(r.FloorDown))}
	if cfg.ServerPID > 0 {
		rows = append(rows, mem(srv, max(r.ServerPeakKB-r.ServerBeforeKB, 1)))
	} else {
		rows = append(rows, failed(LargeFileTarget, srv, fmt.Errorf("no server pid (--server-pid)")))
	}
	return append(rows, mem(envd, r.EnvdPeakKB))
}

func largeFileFigures(mb int) (up, down, srv, envd string) {
	return fmt.Sprintf("e2b JS SDK files.write %d MiB (stream) vs host disk write", mb),
		fmt.Sprintf("e2b JS SDK files.read %d MiB (stream) vs host disk read", mb),
		fmt.Sprintf("server peak RSS growth over the %d MiB round trip", mb),
		fmt.Sprintf("envd peak RSS after the %d MiB round trip", mb)
}
