package template

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Limits of build jobs.
const (
	MaxBuildTime  = 2 * time.Hour
	maxLogEntries = 20000 // per build; older entries are dropped first
	jobsKept      = 200   // finished builds remembered per team for status queries
	// WaitingBuildsPerTeam is the default of how many requested builds
	// one team may leave unstarted at once.
	WaitingBuildsPerTeam = 16
	// waitingTTL is how long a requested build may wait to be started;
	// an older one fails and becomes a finished job like any other.
	waitingTTL = time.Hour
	jobsDir    = ".builds"
)

// Build job states, as the E2B build API names them.
const (
	StatusWaiting  = "waiting"
	StatusBuilding = "building"
	StatusReady    = "ready"
	StatusError    = "error"
)

// RestartedReason is the failure reason of a build a server restart
// interrupted.
const RestartedReason = "server restarted during the build; start it again"

// Builds runs template build jobs (the E2B build API: request, then start)
// and keeps each job's status and logs on disk under <store>/.builds, so
// they answer after a restart; a build in flight at a restart is marked
// failed with RestartedReason. Every job belongs to the team that requested
// it: another team's job is ErrNotFound.
type Builds struct {
	store  *Store
	runner StepRunner
	dir    string
	log    *slog.Logger

	mu      sync.Mutex
	jobs    map[string]*Job // by build ID
	waiting int             // most unstarted builds per team (0: WaitingBuildsPerTeam)

	// done, when set (SetObserver), hears how each build ended and took.
	done func(ok bool, took time.Duration)
}

// SetObserver makes every finished build call done (metrics). Call before
// serving.
func (b *Builds) SetObserver(done func(ok bool, took time.Duration)) { b.done = done }

// SetWaitingPerTeam bounds how many requested, unstarted builds one team
// may hold (0: WaitingBuildsPerTeam). Call before serving.
func (b *Builds) SetWaitingPerTeam(n int) { b.waiting = n }

// Job is one build.
type Job struct {
	BuildID    string    `json:"buildID"`
	TemplateID string    `json:"templateID"`
	TeamID     string    `json:"teamID"`
	Name       string    `json:"name"`
	Tag        string    `json:"tag"`
	Tags       []string  `json:"tags,omitempty"`
	CPUCount   int       `json:"cpuCount,omitempty"`
	MemoryMB   int       `json:"memoryMB,omitempty"`
	Status     string    `json:"status"`
	Reason     *Reason   `json:"reason,omitempty"`
	Dropped    int       `json:"droppedLogEntries,omitempty"`
	CreatedAt  time.Time `json:"createdAt"`

	b       *Builds
	mu      sync.Mutex
	logs    []LogEntry
	logFile *os.File
	step    string
	partial string
}

// LogEntry is one line of a build's log (E2B's BuildLogEntry).
type LogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// Reason says why a build failed (E2B's BuildStatusReason).
type Reason struct {
	Message    string     `json:"message"`
	Step       string     `json:"step,omitempty"`
	LogEntries []LogEntry `json:"logEntries"`
}

// BuildStatus is a job's answer to a status query.
type BuildStatus struct {
	TemplateID string     `json:"templateID"`
	BuildID    string     `json:"buildID"`
	Status     string     `json:"status"`
	LogEntries []LogEntry `json:"logEntries"`
	Logs       []string   `json:"logs"`
	Reason     *Reason    `json:"reason,omitempty"`
}

// NewBuilds opens the job records of store and fails the builds a restart
// interrupted. runner runs RUN steps as sandboxes (nil: builds with RUN
// steps fail saying so).
func NewBuilds(ctx context.Context, store *Store, runner StepRunner, log *slog.Logger) (*Builds, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Builds{store: store, runner: runner, dir: filepath.Join(store.dir, jobsDir), log: log, jobs: map[string]*Job{}}
	// The server opens its builds once, before it serves: what an earlier
	// process left half-received goes now, not at the sweep's TTL.
	if err := store.reconcileUploads(); err != nil {
		return nil, fmt.Errorf("uploads: %w", err)
	}
	if err := os.MkdirAll(b.dir, 0o700); err != nil {
		return nil, fmt.Errorf("build jobs: %w", err)
	}
	entries, err := os.ReadDir(b.dir)
	if err != nil {
		return nil, fmt.Errorf("build jobs: %w", err)
	}
	for _, e := range entries {
		j, err := b.load(e.Name())
		if err != nil {
			log.WarnContext(ctx, "skipping unreadable build job", "build", e.Name(), "err", err)
			continue
		}
		if j.Status == StatusBuilding {
			j.logf("error", "Build failed: %s", RestartedReason)
			j.Status = StatusError
			j.Reason = &Reason{Message: RestartedReason, LogEntries: j.tail(20)}
			if err := j.save(); err != nil {
				return nil, err
			}
			log.InfoContext(ctx, "build interrupted by a restart marked failed", "build", j.BuildID, "template", j.TemplateID)
		}
		b.jobs[j.BuildID] = j
	}
	return b, nil
}

func (b *Builds) load(id string) (*Job, error) {
	if !validJobID(id) {
		return nil, fmt.Errorf("not a build id")
	}
	raw, err := os.ReadFile(filepath.Join(b.dir, id, "job.json"))
	if err != nil {
		return nil, err
	}
	j := &Job{b: b}
	if err := json.Unmarshal(raw, j); err != nil {
		return nil, err
	}
	if j.BuildID != id {
		return nil, fmt.Errorf("job.json names build %q", j.BuildID)
	}
	if f, err := os.Open(filepath.Join(b.dir, id, "logs.jsonl")); err == nil {
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e LogEntry
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				j.logs = append(j.logs, e)
			}
		}
		f.Close()
	}
	return j, nil
}

func validJobID(id string) bool {
	return len(id) == 36 && strings.Trim(id, "0123456789abcdef-") == ""
}

func newJobID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// BuildRequest is the first call of a build: the template's name and
// defaults.
type BuildRequest struct {
	Name, Tag          string
	Tags               []string
	CPUCount, MemoryMB int
}

// Request registers a build of team's template name:tag and returns the job
// (its template ID is the team's ID for that name, see NamedID).
func (b *Builds) Request(ctx context.Context, team string, r BuildRequest) (*Job, error) {
	if team == "" {
		return nil, fmt.Errorf("builds belong to a team: %w", errdefs.ErrInvalidArgument)
	}
	if err := CheckName(team, r.Name); err != nil {
		return nil, err
	}
	if r.Tag == "" {
		r.Tag = "default"
	}
	if _, err := normalizeTags(append([]string{r.Tag}, r.Tags...)); err != nil {
		return nil, err
	}
	// A requested build holds a directory and a record until it is
	// started: each team has a bound on those, and an unstarted one
	// expires.
	b.mu.Lock()
	b.expireWaitingLocked(ctx)
	waiting := 0
	for _, j := range b.jobs {
		if j.TeamID == team && j.state() == StatusWaiting {
			waiting++
		}
	}
	b.mu.Unlock()
	if limit := cmp.Or(b.waiting, WaitingBuildsPerTeam); waiting >= limit {
		return nil, fmt.Errorf("team has %d requested builds not yet started (at most %d; start or wait for them, an unstarted build expires %s after it was requested, or raise serve --build-requests-per-team): %w",
			waiting, limit, waitingTTL, errdefs.ErrResourceExhausted)
	}
	j := &Job{
		BuildID: newJobID(), TemplateID: NamedID(team, r.Name, r.Tag), TeamID: team, Name: r.Name, Tag: r.Tag,
		Tags: r.Tags, CPUCount: r.CPUCount, MemoryMB: r.MemoryMB, Status: StatusWaiting, CreatedAt: time.Now().UTC(), b: b,
	}
	if err := os.Mkdir(filepath.Join(b.dir, j.BuildID), 0o700); err != nil {
		return nil, fmt.Errorf("build job: %w", err)
	}
	if err := j.save(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.jobs[j.BuildID] = j
	b.pruneLocked(ctx)
	b.mu.Unlock()
	b.store.crash.After(OpBuild, StepBuildRequested)
	return j, nil
}

// state is the job's status.
func (j *Job) state() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.Status
}

// expireWaitingLocked fails every requested build nobody started within
// waitingTTL.
func (b *Builds) expireWaitingLocked(ctx context.Context) {
	now := time.Now()
	for _, j := range b.jobs {
		j.mu.Lock()
		if j.Status != StatusWaiting || now.Sub(j.CreatedAt) < waitingTTL {
			j.mu.Unlock()
			continue
		}
		msg := fmt.Sprintf("the build was not started within %s of its request; request it again", waitingTTL)
		j.Status = StatusError
		j.Reason = &Reason{Message: msg, LogEntries: []LogEntry{}}
		j.mu.Unlock()
		if err := j.save(); err != nil {
			b.log.WarnContext(ctx, "expire unstarted build", "build", j.BuildID, "err", err)
		}
	}
}

// pruneLocked forgets each team's oldest finished jobs past jobsKept: one
// team's churn never pushes out another team's build history.
func (b *Builds) pruneLocked(ctx context.Context) {
	done := map[string][]*Job{}
	for _, j := range b.jobs {
		if st := j.state(); st == StatusReady || st == StatusError {
			done[j.TeamID] = append(done[j.TeamID], j)
		}
	}
	for _, jobs := range done {
		if len(jobs) <= jobsKept {
			continue
		}
		slices.SortFunc(jobs, func(x, y *Job) int { return x.CreatedAt.Compare(y.CreatedAt) })
		for _, j := range jobs[:len(jobs)-jobsKept] {
			delete(b.jobs, j.BuildID)
			if err := os.RemoveAll(filepath.Join(b.dir, j.BuildID)); err != nil {
				b.log.WarnContext(ctx, "build job removal incomplete", "build", j.BuildID, "err", err)
			}
		}
	}
}

// job returns team's job buildID of templateID, or ErrNotFound: also when
// it is another team's.
func (b *Builds) job(ctx context.Context, team, templateID, buildID string) (*Job, error) {
	b.mu.Lock()
	j := b.jobs[buildID]
	b.mu.Unlock()
	if j == nil {
		j = b.finished(ctx, team, templateID, buildID)
	}
	if j == nil || team == "" || j.TeamID != team || j.TemplateID != templateID {
		return nil, fmt.Errorf("build %q of template %q: %w", buildID, templateID, errdefs.ErrNotFound)
	}
	return j, nil
}

// finished stands in for a job no longer kept when the template it made
// records its ID: the build succeeded. Its logs are gone.
func (b *Builds) finished(ctx context.Context, team, templateID, buildID string) *Job {
	t, err := b.store.Get(ctx, team, templateID)
	if err != nil || t.ID != templateID || !t.OwnedBy(team) || t.BuildID == "" || t.BuildID != buildID {
		return nil
	}
	name := ""
	if len(t.Aliases) > 0 {
		name = t.Aliases[0]
	}
	return &Job{
		BuildID: buildID, TemplateID: t.ID, TeamID: team, Name: name, Status: StatusReady, CreatedAt: t.CreatedAt, b: b,
		logs: []LogEntry{{Timestamp: t.CreatedAt, Level: "info", Message: fmt.Sprintf("Template %s was built at %s", t.ID, t.CreatedAt.Format(time.RFC3339))}},
	}
}

// Start runs team's requested build with spec's base and steps (its name,
// ID, team and runner are the job's). It returns once the build is under
// way; the build outlives ctx, up to MaxBuildTime.
func (b *Builds) Start(ctx context.Context, team, templateID, buildID string, spec BuildSpec) error {
	j, err := b.job(ctx, team, templateID, buildID)
	if err != nil {
		return err
	}
	for i, st := range spec.Steps {
		if st.FilesHash != "" && !b.store.HasUpload(team, st.FilesHash) {
			return fmt.Errorf("steps[%d]: COPY %s: files %s were not uploaded (GET /templates/%s/files/%s gives an upload link): %w",
				i, strings.Join(st.Src, " "), st.FilesHash, templateID, st.FilesHash, errdefs.ErrInvalidArgument)
		}
	}
	spec.TeamID, spec.Name, spec.Tag, spec.Tags, spec.ID, spec.BuildID = team, j.Name, j.Tag, j.Tags, j.TemplateID, j.BuildID
	spec.CPUCount, spec.MemoryMB, spec.Runner, spec.LocalImages = j.CPUCount, j.MemoryMB, b.runner, false
	// A full disk refuses the start itself (507 to the client, not a
	// failed build later): the build stays waiting, to start once there
	// is room.
	if err := b.store.admitDisk("build a template"); err != nil {
		return err
	}
	// The build holds its slot in the team's quota from here until it
	// ends, however it ends; refused, it stays waiting and can be started
	// again later.
	release := func() {}
	if a, ok := b.runner.(BuildAdmitter); ok {
		if release, err = a.AdmitBuild(ctx, BuildAdmission{TeamID: team, BuildID: j.BuildID, CPUCount: j.CPUCount, MemoryMB: j.MemoryMB}); err != nil {
			return err
		}
	}
	j.mu.Lock()
	if j.Status != StatusWaiting {
		st := j.Status
		j.mu.Unlock()
		release()
		return fmt.Errorf("build %s is %s, not waiting to be started (a build starts once; request a new one): %w", buildID, st, errdefs.ErrConflict)
	}
	j.Status = StatusBuilding
	f, err := os.OpenFile(filepath.Join(b.dir, j.BuildID, "logs.jsonl"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err == nil {
		j.logFile = f
	}
	j.mu.Unlock()
	if err := j.save(); err != nil {
		release()
		return err
	}
	b.store.crash.After(OpBuild, StepBuildStarted)
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), MaxBuildTime)
	go func() {
		defer release()
		defer cancel()
		j.logf("info", "Building template %s:%s (%s)", j.Name, j.Tag, j.TemplateID)
		began := time.Now()
		tpl, err := b.store.BuildFromSpec(bctx, spec, j)
		err = b.store.explainDisk("build a template", err)
		release() // before the status says the build ended
		if err == nil {
			b.store.crash.After(OpBuild, StepBuildPublished)
		}
		j.finish(tpl, err)
		b.store.crash.After(OpBuild, StepBuildFinished)
		if b.done != nil {
			b.done(err == nil, time.Since(began))
		}
		if err != nil {
			b.log.Warn("template build failed", "template", j.TemplateID, "build", j.BuildID, "team", team, "err", err)
		}
	}()
	return nil
}

// Status answers team's status query: log entries from offset (counting
// every entry ever logged), at most limit, of level if set.
func (b *Builds) Status(ctx context.Context, team, templateID, buildID string, offset, limit int, level string) (*BuildStatus, error) {
	j, err := b.job(ctx, team, templateID, buildID)
	if err != nil {
		return nil, err
	}
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	out := &BuildStatus{TemplateID: j.TemplateID, BuildID: j.BuildID, Status: j.Status, LogEntries: []LogEntry{}, Logs: []string{}, Reason: j.Reason}
	for i := max(offset-j.Dropped, 0); i < len(j.logs) && len(out.LogEntries) < limit; i++ {
		if level == "" || j.logs[i].Level == level {
			out.LogEntries = append(out.LogEntries, j.logs[i])
		}
	}
	return out, nil
}

// Logs returns every log entry of team's build that is kept.
func (b *Builds) Logs(ctx context.Context, team, templateID, buildID string) ([]LogEntry, error) {
	j, err := b.job(ctx, team, templateID, buildID)
	if err != nil {
		return nil, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.logs), nil
}

func (j *Job) save() error {
	j.mu.Lock()
	raw, err := json.MarshalIndent(j, "", "  ")
	j.mu.Unlock()
	if err != nil {
		return err
	}
	p := filepath.Join(j.b.dir, j.BuildID, "job.json")
	if err := os.WriteFile(p+".tmp", append(raw, '\n'), 0o600); err != nil {
		return fmt.Errorf("build job: %w", err)
	}
	return os.Rename(p+".tmp", p)
}

// Write receives the builder's progress output and turns it into log
// entries; "==> [n/m]" lines start step n.
func (j *Job) Write(p []byte) (int, error) {
	j.mu.Lock()
	lines := strings.Split(j.partial+string(p), "\n")
	j.partial = lines[len(lines)-1]
	j.mu.Unlock()
	for _, l := range lines[:len(lines)-1] {
		if rest, ok := strings.CutPrefix(l, "==> ["); ok {
			if n, _, ok := strings.Cut(rest, "/"); ok {
				j.mu.Lock()
				j.step = n
				j.mu.Unlock()
			}
		}
		j.logf("info", "%s", l)
	}
	return len(p), nil
}

func (j *Job) logf(level, format string, args ...any) {
	e := LogEntry{Timestamp: time.Now().UTC(), Level: level, Message: fmt.Sprintf(format, args...)}
	j.mu.Lock()
	defer j.mu.Unlock()
	e.Step = j.step
	j.logs = append(j.logs, e)
	if over := len(j.logs) - maxLogEntries; over > 0 {
		j.logs = j.logs[over:]
		j.Dropped += over
	}
	if j.logFile != nil && j.Dropped == 0 {
		if raw, err := json.Marshal(e); err == nil {
			_, _ = j.logFile.Write(append(raw, '\n'))
		}
	}
}

func (j *Job) tail(n int) []LogEntry {
	return append([]LogEntry{}, j.logs[max(0, len(j.logs)-n):]...)
}

func (j *Job) finish(tpl *Template, err error) {
	if err == nil {
		j.logf("info", "Template %s:%s is ready (%s)", j.Name, j.Tag, tpl.ID)
	} else {
		j.logf("error", "Build failed: %s", err)
	}
	j.mu.Lock()
	if err == nil {
		j.Status = StatusReady
	} else {
		j.Status = StatusError
		j.Reason = &Reason{Message: err.Error(), LogEntries: j.tail(20)}
		if be, ok := errors.AsType[*BuildError](err); ok {
			j.Reason.Step = strconv.Itoa(be.Step)
		}
	}
	if j.logFile != nil {
		// Rewrite the kept entries: the file stopped growing at the first drop.
		if j.Dropped > 0 {
			_ = j.logFile.Truncate(0)
			for _, e := range j.logs {
				if raw, err := json.Marshal(e); err == nil {
					_, _ = j.logFile.Write(append(raw, '\n'))
				}
			}
		}
		j.logFile.Close()
		j.logFile = nil
	}
	j.mu.Unlock()
	if err := j.save(); err != nil {
		j.b.log.Warn("build job not saved", "build", j.BuildID, "err", err)
	}
}

// HasTemplate reports whether team has a build of template id on record:
// the first build of a name has a template ID before it has a template.
func (b *Builds) HasTemplate(team, id string) bool {
	if team == "" {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, j := range b.jobs {
		if j.TeamID == team && j.TemplateID == id {
			return true
		}
	}
	return false
}
