package benchmark

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
)

// TargetRow is one line of the issue-14 table: a figure of the server next
// to the raw part it is held to, measured in the same run.
type TargetRow struct {
	Target int     // the target's number in issue 14
	Figure string  // what is measured
	Value  string  // the server's figure
	Floor  string  // the raw part's figure (or the absolute bound it is held to)
	Ratio  float64 // Value over Floor (for throughput, the server's rate over the floor's); 0 when not measured
	Goal   string  // the target, as the issue states it
	Met    bool
	Err    string // why the row has no figure: the part that failed
}

// Result is MET, MISSED or ERROR.
func (r TargetRow) Result() string {
	switch {
	case r.Err != "":
		return "ERROR"
	case r.Met:
		return "met"
	default:
		return "MISSED"
	}
}

// failed is a row whose part could not be measured.
func failed(target int, figure string, err error) TargetRow {
	return TargetRow{Target: target, Figure: figure, Err: firstLine(err.Error())}
}

// atMost is a row held to limit × its floor.
func atMost(target int, figure string, v, floor time.Duration, limit float64) TargetRow {
	r := TargetRow{Target: target, Figure: figure, Value: round(v).String(), Floor: round(floor).String(),
		Goal: "≤ " + strconv.FormatFloat(limit, 'f', -1, 64) + "x"}
	if floor <= 0 {
		r.Err = "no floor measured"
		return r
	}
	r.Ratio = float64(v) / float64(floor)
	r.Met = r.Ratio <= limit
	return r
}

// below is a row held to an absolute bound; its ratio is against the raw
// part named floor, for scale.
func below(target int, figure string, v, floor, bound time.Duration) TargetRow {
	r := TargetRow{Target: target, Figure: figure, Value: round(v).String(), Floor: round(floor).String(),
		Goal: "< " + bound.String(), Met: v < bound}
	if floor <= 0 {
		r.Err = "no floor measured"
		return r
	}
	r.Ratio = float64(v) / float64(floor)
	return r
}

// WriteTargets prints rows as one table.
func WriteTargets(w io.Writer, rows []TargetRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tFIGURE\tAGENTBOX\tFLOOR\tRATIO\tTARGET\tRESULT")
	for _, r := range rows {
		value, ratio := r.Value, ""
		if r.Err != "" {
			value = "error: " + r.Err
		} else if r.Ratio > 0 {
			ratio = fmt.Sprintf("%.2fx", r.Ratio)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Target, r.Figure, value, r.Floor, ratio, r.Goal, r.Result())
	}
	return tw.Flush()
}
