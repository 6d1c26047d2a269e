package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/authlimit"
	"github.com/agentbox/agentbox/internal/crashpoint"
	"github.com/agentbox/agentbox/internal/diskspace"
	"github.com/agentbox/agentbox/internal/gateway"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/metrics"
	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/runtime/microvm"
	"github.com/agentbox/agentbox/internal/runtime/runc"
	"github.com/agentbox/agentbox/internal/runtime/runsc"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/seccomplog"
	"github.com/agentbox/agentbox/internal/seccomprules"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/template"
	"github.com/agentbox/agentbox/internal/tracing"
	"github.com/agentbox/agentbox/internal/usage"
	"github.com/agentbox/agentbox/internal/volume"
)

// serveConfig is every setting of `agentbox serve`. Each is a flag, an
// environment variable AGENTBOX_<FLAG> (dashes as underscores) and a key of
// the JSON config file; a flag beats the environment, which beats the file.
type serveConfig struct {
	Instance        string
	Listen          string
	DataPlaneListen string
	DataDir         string
	TemplateDir     string
	Envd            string
	Runc            string
	Bridge          string
	Subnet          string
	MaxTimeout      time.Duration
	MaxCommandLife  time.Duration
	HealthInterval  time.Duration
	ShutdownGrace   time.Duration
	DiskReserveMB   int
	Runsc           string
	MicroVMAccel    string
	UserNS          bool
	DiskPool        int
	BuildBase       bool
	LogLevel        string
	LogFormat       string
	MetricsToken    string
	MetricsListen   string
	MetricsMaxSB    int
	ConfigFile      string
	TrustedProxies  []string
	VolumeSizeMB    int
	VolumeMaxSizeMB int
	MaxVolumes      int
	Net             netFlags
	Fetch           fetchFlags     // fetchflags.go
	Events          eventsFlags    // serve_events.go
	Lifecycle       lifecycleFlags // serve_lifecycle.go
	Audit           auditFlags     // audit.go

	CRIUFreezeTimeout    time.Duration // runc.Config.FreezeTimeout
	LazyResumeMB         int           // runc.Config.LazyResumeMB
	VolumeTeamMaxTotalMB int           // volume.Config.MaxTotalMBPerTeam
	Bounds               boundsFlags   // serve_bounds.go
	Unpack               unpackFlags   // serve_unpack.go
	Kube                 kubeFlags     // serve_kube.go
	KubeAPI              kubeAPIFlags  // serve_kubeapi.go
}

func newServeCmd() *cobra.Command {
	var c serveConfig
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the agentbox server: E2B-compatible API, data-plane gateway and sandboxes",
		Long: `Run the agentbox server in the foreground (as root).

One process serves the E2B-compatible REST API and the sandbox data plane on
one address: requests carrying E2b-Sandbox-Id/E2b-Sandbox-Port headers, or a
Host of the form <port>-<sandboxID>.<domain>, go to the sandbox; everything
else goes to the API (and the web dashboard, at /dashboard/). A port host
never reaches the API or the dashboard: each sandbox port is a web origin of
its own. Without --domain, browsers reach a port at
http://<port>-<sandboxID>.localhost:<listen port>/ (*.localhost is loopback,
no DNS set-up); the old path form /sandboxes/<id>/ports/<port>/ redirects
there. State lives in
--data-dir (SQLite); the first start
creates an API key and writes it to <data-dir>/apikey (mode 0600), and builds
the "base" template if it is missing (about 1-2 minutes, cached).

Sandboxes keep running when the server stops (also on kill -9); the next
start on the same data dir re-adopts them or cleans up what is left.

With --kubernetes it is instead the stateless E2B API tier of a Kubernetes
cluster (unprivileged, no data dir): sandboxes run on the node agents
(serve --kube-controller) and keys come from apikey create --kubernetes.

Every flag can also be set with an environment variable AGENTBOX_<FLAG>
(e.g. AGENTBOX_LISTEN=0.0.0.0:3000) or in a JSON file given with --config
({"listen": "...", "max-timeout": "24h"}); flags win over the environment,
which wins over the file.`,
		Example: `  sudo agentbox serve
  sudo agentbox serve --listen 0.0.0.0:3000 --data-dir /srv/agentbox`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := applyEnvAndFile(cmd.Flags(), c.ConfigFile); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return serve(ctx, c, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Instance, "instance", "agentbox", "name of this server instance on the host: its runc root and netns dir (/run/<instance>/), nftables table and cgroup parent; servers with different names never touch each other's sandboxes")
	f.StringVar(&c.Listen, "listen", "127.0.0.1:3000", "address for the API and the data plane")
	f.StringVar(&c.DataPlaneListen, "data-plane-listen", "", "optional second address serving only sandbox traffic")
	f.StringVar(&c.DataDir, "data-dir", "/var/lib/agentbox", "state directory: database, API key, sandboxes")
	f.StringVar(&c.TemplateDir, "template-dir", "", "template store, recorded in <data-dir>/template-dir for the operator commands (default: the recorded one, else <data-dir>/templates)")
	f.StringVar(&c.Envd, "envd", "", "path of the static envd binary (default: envd next to this binary, then $PATH)")
	f.StringVar(&c.Runc, "runc", "runc", "OCI runtime binary")
	f.StringVar(&c.Bridge, "bridge", "agentbox0", "host bridge the sandboxes attach to (past 1,000 sandboxes, also <bridge>-1, <bridge>-2, ...)")
	f.StringVar(&c.Subnet, "subnet", "10.11.0.0/16", "IPv4 subnet for sandbox addresses")
	f.DurationVar(&c.MaxTimeout, "max-timeout", 24*time.Hour, "longest sandbox timeout a client may ask for")
	f.DurationVar(&c.MaxCommandLife, "max-command-lifetime", sandbox.DefaultMaxCommandLifetime, "longest any one command in a sandbox may run; envd kills it then (a create may ask for less with maxCommandSeconds)")
	f.DurationVar(&c.HealthInterval, "health-interval", 30*time.Second, "how often every sandbox's envd is health-checked")
	f.DurationVar(&c.ShutdownGrace, "shutdown-grace", 10*time.Second, "on SIGTERM, how long requests in flight may run on before their connections are closed (sandboxes keep running either way)")
	f.IntVar(&c.DiskReserveMB, "disk-reserve-mb", defaultDiskReserveMB, "MiB kept free on the data and template disks: creates, forks, restores, builds, uploads, snapshots, pauses, volume creates and volume writes are refused with 507 while less is free, so the server can always record state and delete things (a quarter, at most 64 MiB, is held in a file <dir>/"+diskspace.ReserveFile+" and given back when a disk runs out); 0 turns the guard off")
	f.DurationVar(&c.CRIUFreezeTimeout, "criu-freeze-timeout", runc.DefaultFreezeTimeout, "how long a pause, snapshot or fork of a container-tier sandbox may take to freeze its processes (CRIU's --timeout, whole seconds, at least 1s); a pause that times out is tried once more, then fails with the sandbox still running")
	f.IntVar(&c.LazyResumeMB, "lazy-resume-mb", runc.DefaultLazyResumeMB, "resume a paused container-tier sandbox whose memory image is at least this many MiB lazily: it runs at once and its memory is loaded on first touch and in the background (CRIU lazy pages over userfaultfd; a full restore where that is unavailable); -1 never")
	f.StringVar(&c.Runsc, "runsc", "runsc", "gVisor runsc binary for the gvisor isolation tier (the tier is unavailable when it is missing)")
	f.StringVar(&c.MicroVMAccel, "microvm-accel", "", "accelerator of the microvm isolation tier: kvm, tcg, or empty to use KVM where it boots a guest and TCG (software emulation) elsewhere")
	f.IntVar(&c.DiskPool, "disk-pool", 2, "sandbox disks (the writable layer of a sandbox with a disk limit) kept made, attached and mounted ahead of creates (each a fresh copy of the empty disk image, used by one sandbox only; refilled in the background), which takes the loop device and ext4 mount off the create path; 0 makes each disk in its create")
	f.BoolVar(&c.UserNS, "userns", true, "run container-tier sandboxes in a user namespace that owns their network namespace, each with a host uid range of its own (65536 ids from host uid 100000 on), so sandbox root owns nothing of another sandbox (template layers are shown through idmapped mounts, or uid-shifted copies where the kernel cannot idmap); --userns=false shares the host's user namespace")
	addLifecycleFlags(f, &c.Lifecycle)
	f.BoolVar(&c.BuildBase, "build-base", true, "build the base template at start if this version's is missing (an older base stays, for the sandboxes and templates made from it)")
	f.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&c.MetricsToken, "metrics-token", "", "serve Prometheus metrics at /metrics on --listen to requests with \"Authorization: Bearer <this token>\" (or set AGENTBOX_METRICS_TOKEN); without it /metrics there is off")
	f.IntVar(&c.MetricsMaxSB, "metrics-max-sandboxes", metrics.DefaultMaxSandboxSeries, "export per-sandbox CPU, memory, disk and network series for at most this many running sandboxes (the rest are counted in agentbox_sandbox_series_omitted); 0 turns them off")
	f.StringVar(&c.MetricsListen, "metrics-listen", "", "also serve Prometheus metrics, without a token, at /metrics on this address (keep it private, e.g. 127.0.0.1:9090)")
	f.StringVar(&c.LogFormat, "log-format", "text", "text (key=value) or json (one object per line, for log collectors)")
	f.StringVar(&c.ConfigFile, "config", "", "JSON config file with flag names as keys")
	f.StringSliceVar(&c.TrustedProxies, "trusted-proxy", nil, "addresses or CIDRs of reverse proxies in front of the server, whose X-Forwarded-For names the client; wrong API keys and tokens are rate limited per client address (20 in a row, then one per 3 s; past that wrong ones are answered 429 with Retry-After, while a valid key or token is always served), and without this the proxy's address would count for all its clients")
	f.IntVar(&c.VolumeSizeMB, "volume-size", volume.DefaultSizeMB, "size limit in MiB of a team volume created without sizeMB")
	f.IntVar(&c.VolumeMaxSizeMB, "volume-max-size", volume.DefaultMaxSizeMB, "largest volume in MiB a team may create (images are sparse: the host's disk holds what is written, up to the sum of the sizes)")
	f.IntVar(&c.MaxVolumes, "max-volumes", volume.DefaultMaxPerTeam, "most volumes one team may have")
	f.IntVar(&c.VolumeTeamMaxTotalMB, "volume-team-max-total-size", volume.DefaultMaxTotalMBPerTeam, "most MiB the sizes of one team's volumes may add up to")
	addNetFlags(f, &c.Net)
	addFetchFlags(f, &c.Fetch)
	addEventsFlags(f, &c.Events)
	addAuditFlags(f, &c.Audit)
	addBoundsFlags(f, &c.Bounds)
	addUnpackFlags(f, &c.Unpack)
	addKubeFlags(f, &c.Kube)
	addKubeAPIFlags(f, &c.KubeAPI)
	return cmd
}

// parseTrustedProxies parses --trusted-proxy: addresses or CIDRs.
func parseTrustedProxies(vals []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range vals {
		v = strings.TrimSpace(v)
		if p, err := netip.ParsePrefix(v); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(v)
		if err != nil {
			return nil, fmt.Errorf("--trusted-proxy: %q is not an address or CIDR (e.g. 10.0.0.5 or 10.0.0.0/24)", v)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// applyEnvAndFile fills every flag not given on the command line from
// AGENTBOX_<FLAG>, then from the config file.
func applyEnvAndFile(fs *pflag.FlagSet, file string) error {
	if file == "" {
		file = os.Getenv("AGENTBOX_CONFIG")
	}
	fileVals := map[string]any{}
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("--config: %w", err)
		}
		if err := json.Unmarshal(data, &fileVals); err != nil {
			return fmt.Errorf("--config %s: not a JSON object of flag names to values: %w", file, err)
		}
		for k := range fileVals {
			if fs.Lookup(k) == nil {
				return fmt.Errorf("--config %s: unknown setting %q (settings are the flag names of `agentbox serve --help`)", file, k)
			}
		}
	}
	var errs []error
	fs.VisitAll(func(fl *pflag.Flag) {
		// Hidden flags are test switches (a crash point): only the command
		// line sets them, so no environment or config file can.
		if fl.Changed || fl.Hidden {
			return
		}
		env := "AGENTBOX_" + strings.ToUpper(strings.ReplaceAll(fl.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok {
			if err := fl.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", env, v, err))
			}
			return
		}
		if v, ok := fileVals[fl.Name]; ok {
			if err := fl.Value.Set(fmt.Sprint(v)); err != nil {
				errs = append(errs, fmt.Errorf("config %s=%v: %w", fl.Name, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is not a format; use text or json", format)
}

// findEnvd locates the envd binary: explicit path, next to this executable, $PATH.
func findEnvd(explicit string) (string, error) {
	if explicit != "" {
		if _, err := os.Stat(explicit); err != nil {
			return "", fmt.Errorf("--envd: %w", err)
		}
		return filepath.Abs(explicit)
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "envd")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("envd binary not found next to agentbox; build it with `make build` or pass --envd")
}

// newRuntime registers the server's isolation tiers over one bundle store:
// runc (the default), runsc and microvm. The registry is the runtime the sandbox
// manager uses; it routes each sandbox to its tier's driver.
func newRuntime(c *serveConfig, runDir, envd, hookBin string, nw *network.Manager, log *slog.Logger) (*bundle.Store, *runtime.Tiers, error) {
	if c.DiskPool < 0 || c.DiskPool > 64 {
		return nil, nil, fmt.Errorf("--disk-pool %d: want 0 (no pool) to 64 disks made ahead", c.DiskPool)
	}
	runcRoot := filepath.Join(runDir, "runc")
	bundles, err := bundle.New(bundle.Config{
		StateDir:     filepath.Join(c.DataDir, "sandboxes"),
		CgroupParent: c.Instance,
		EnvdPath:     envd,
		UserNS:       c.UserNS,
		// Beside runc's state, on a tmpfs, so a reboot forgets them with
		// everything else.
		IdmapDir:   runcRoot + "-idmap",
		HookBinary: hookBin,
		DiskPool:   c.DiskPool,
	}, log)
	if err != nil {
		return nil, nil, err
	}
	rc, err := runc.New(runc.Config{Bundles: bundles, Binary: c.Runc, Root: runcRoot, Net: nw, FreezeTimeout: c.CRIUFreezeTimeout, LazyResumeMB: c.LazyResumeMB}, log)
	if err != nil {
		return nil, nil, err
	}
	rs, err := runsc.New(runsc.Config{Bundles: bundles, Binary: c.Runsc, Root: runcRoot + "-runsc", Net: nw}, log)
	if err != nil {
		return nil, nil, err
	}
	mv, err := microvm.New(microvm.Config{
		StateDir: filepath.Join(c.DataDir, "microvm"), RunDir: filepath.Join(runDir, "microvm"), Envd: envd,
		Accel: c.MicroVMAccel, CgroupParent: c.Instance, Net: nw, HookBinary: hookBin,
	}, log)
	if err != nil {
		return nil, nil, err
	}
	tiers, err := runtime.NewTiers(rc.Tier(), rs.Tier(), mv.Tier())
	if err != nil {
		return nil, nil, err
	}
	return bundles, tiers, nil
}

// startSyscallAudit reports the syscalls the container tier's seccomp policy
// refuses as "syscall" audit events of the sandbox that made them. Without
// kernel audit support the server runs on and says so.
func startSyscallAudit(ctx context.Context, mgr *sandbox.Manager, bundles *bundle.Store, cgroupParent string, log *slog.Logger) {
	w, err := seccomplog.Open(seccomplog.Config{
		CgroupParent: cgroupParent,
		ByCgroup:     bundles.SandboxOfCgroup,
		BySession:    bundles.SandboxOfSession,
		Explain:      seccomprules.Reason,
		Sink: func(ctx context.Context, d seccomplog.Denial) {
			sb, err := mgr.Get(ctx, "", d.SandboxID)
			if err != nil {
				return // removed meanwhile, or a leftover cgroup
			}
			e := d.Event()
			e.TeamID, e.APIKeyID = sb.TeamID, sb.APIKeyID
			mgr.Audit().Record(ctx, e)
		},
	}, log)
	if err != nil {
		log.Warn("refused syscalls will not be audited", "err", err)
		return
	}
	go w.Run(ctx)
}

// hideRunDir makes the server's run dir and its netns pin dir searchable
// but not listable by other host users (the network manager keeps its
// address records in netns.addr, 0700).
func hideRunDir(runDir string) error {
	for _, d := range []string{runDir, filepath.Join(runDir, "netns")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return fmt.Errorf("run dir: %w", err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return fmt.Errorf("run dir: %w", err)
		}
	}
	return nil
}

func listen(ctx context.Context, addr string) (net.Listener, error) {
	// MPTCP off: CRIU cannot checkpoint it and Landlock does not cover it.
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	return lc.Listen(ctx, "tcp", addr)
}

func serve(ctx context.Context, c serveConfig, out io.Writer) error {
	log, err := newLogger(os.Stderr, c.LogLevel, c.LogFormat)
	if err != nil {
		return err
	}
	if c.KubeAPI.Enabled {
		return serveKubeAPI(ctx, c, log) // serve_kubeapi.go: unprivileged, no store
	}
	if os.Geteuid() != 0 {
		return errors.New("agentbox serve needs root (namespaces, cgroups, nftables, mounts); run it with sudo")
	}
	subnet, err := netip.ParsePrefix(c.Subnet)
	if err != nil {
		return fmt.Errorf("--subnet: %w", err)
	}
	c.TemplateDir = templateStoreDir(c.DataDir, c.TemplateDir)
	envd, err := findEnvd(c.Envd)
	if err != nil {
		return err
	}
	auditOpts, err := c.Audit.options()
	if err != nil {
		return err
	}
	if !store.ValidTeamName(c.Instance) || strings.ContainsAny(c.Instance, ".") {
		return fmt.Errorf("--instance %q: use letters, digits, '-' and '_'", c.Instance)
	}
	placeServer(c.Instance, log)
	if err := privateDataDir(c.DataDir); err != nil {
		return err
	}
	if err := recordTemplateDir(c.DataDir, c.TemplateDir); err != nil {
		return err
	}
	if envd, err = pinEnvd(envd, c.DataDir); err != nil { // serve_lifecycle.go
		return err
	}
	// Sandboxes bind-mount envd as their mapped root: the directory may be
	// searched, not listed (the binary itself is no secret).
	if err := os.Chmod(filepath.Dir(envd), 0o711); err != nil {
		return fmt.Errorf("envd: %w", err)
	}
	st, err := store.Open(ctx, filepath.Join(c.DataDir, "agentbox.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	key, err := firstKey(ctx, st, c.DataDir)
	if err != nil {
		return err
	}

	templates, err := template.NewStore(c.TemplateDir, log)
	if err != nil {
		return err
	}
	templates.SetCrash(crashpoint.New(cmp.Or(c.Lifecycle.CrashAfter, c.Lifecycle.FaultStep), log))
	templates.SetInstance(c.Instance)
	// Every fetch a build makes for a tenant goes through this policy.
	fetchPolicy, err := c.Fetch.policy(subnet)
	if err != nil {
		return err
	}
	templates.SetFetchPolicy(fetchPolicy)
	// Layers, build contexts and restored images unpack within one set of
	// limits (serve_unpack.go).
	unpackLimits, err := c.Unpack.limits()
	if err != nil {
		return err
	}
	templates.SetUnpackLimits(unpackLimits)
	disk, err := c.diskGuard() // serve_disk.go
	if err != nil {
		return err
	}
	templates.SetDiskGuard(disk)
	if c.BuildBase {
		base := template.BuiltinDefinitions()["base"]
		baseID, err := base.ID()
		if err != nil {
			return err
		}
		// By its id, not by the alias: a server whose builtin base changed
		// builds the new one, which the alias then names (newest first).
		if _, err := templates.Get(ctx, "", baseID); err != nil {
			fmt.Fprintln(out, "Building the base template (first start only; about 1-2 minutes)...")
			if _, err := templates.Build(ctx, base, nil, out); err != nil {
				return fmt.Errorf("build base template: %w", err)
			}
		}
	}

	runDir := filepath.Join("/run", c.Instance)
	opAllow, err := c.Net.operatorAllow()
	if err != nil {
		return err
	}
	nw, err := network.New(network.Config{Bridge: c.Bridge, Subnet: subnet, NetNSDir: filepath.Join(runDir, "netns"), Table: c.Instance, OperatorAllow: opAllow,
		// The runtime makes every sandbox's netns and plugs it in: a
		// sandbox in a user namespace must own its netns (see plug.go).
		Deferred: true}, log)
	if err != nil {
		return err
	}
	eg, err := startEgress(ctx, c.Net, nw, st, subnet, opAllow, c.Audit.egressLimits(), log)
	if err != nil {
		return err
	}
	defer eg.Close()
	failEgressProxy(ctx, eg, c.Lifecycle.FailEgressEvery, log) // faulthooks.go
	if err := nw.Setup(ctx); err != nil {
		return fmt.Errorf("network setup: %w", err)
	}
	// Host users must not list what is named by sandbox id under the run
	// dir (netns files, address records, runc's state): traversal only.
	if err := hideRunDir(runDir); err != nil {
		return err
	}
	hookBin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the agentbox binary for the runtime's hooks: %w", err)
	}
	bundles, rt, err := newRuntime(&c, runDir, envd, hookBin, nw, log)
	if err != nil {
		return err
	}
	tokenSecret, err := readTokenSecret(c.KubeAPI.TokenSecretFile)
	if err != nil {
		return err
	}
	auditLog := audit.New(st, append(auditOpts, audit.WithLogger(log))...)
	// The metrics read the manager, which reports to them: the source
	// gets the manager once it is made, before anything scrapes.
	metSrc := &metricSource{}
	mets := metrics.New(metSrc)
	mets.SetMaxSandboxSeries(c.MetricsMaxSB)
	tracer, stopTracing, err := tracing.Setup(ctx, os.Getenv) // off unless OTEL_* ask
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := stopTracing(sctx); err != nil {
			log.Warn("flush traces", "err", err)
		}
	}()
	meter := usage.NewMeter(st, sandbox.DefaultSampleInterval, log)
	eg.SetObserver(egressFanout{mets: mets, meter: meter}) // serve_metering.go
	// Pause/resume, snapshots and pools: serve_lifecycle.go.
	lifecycle, err := lifecycleConfig(c)
	if err != nil {
		return err
	}
	vols, err := volume.New(ctx, volume.Config{Dir: filepath.Join(c.DataDir, "volumes"), DefaultSizeMB: c.VolumeSizeMB,
		MaxSizeMB: c.VolumeMaxSizeMB, MaxPerTeam: c.MaxVolumes, MaxTotalMBPerTeam: c.VolumeTeamMaxTotalMB,
		Crash: crashpoint.New(cmp.Or(c.Lifecycle.CrashAfter, c.Lifecycle.FaultStep), log)}, st, log)
	if err != nil {
		return err
	}
	vols.SetDiskGuard(disk)
	mgr, err := sandbox.New(ctx, sandbox.Options{
		Config:    sandbox.Config{MaxTimeout: c.MaxTimeout, HealthInterval: c.HealthInterval, MaxCommandLifetime: c.MaxCommandLife, TokenSecret: tokenSecret},
		Lifecycle: lifecycle, Log: log, Store: st, Runtime: rt, Network: nw, Templates: templates,
		Audit: auditLog, Observer: mets, Tracer: tracer, Meter: meter, Volumes: vols, DiskGuard: disk,
	})
	if err != nil {
		return err
	}
	metSrc.mgr = mgr
	vols.SetUsers(mgr.VolumeUsers)
	gw := gateway.New(mgr, log)
	gw.SetAudit(mgr.Audit())
	gw.SetRequestCounter(mets.GatewayRequest)
	eg.SetAudit(mgr.Audit())
	if err := mgr.Reconcile(ctx); err != nil {
		return fmt.Errorf("reconcile sandboxes: %w", err)
	}
	if err := vols.Reconcile(ctx); err != nil {
		return fmt.Errorf("reconcile volumes: %w", err)
	}
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	go mgr.Run(runCtx)
	defer runAudit(runCtx, mgr.Audit())() // audit.go
	startSyscallAudit(runCtx, mgr, bundles, c.Instance, log)
	// The host-side guards: hostguard.go.
	startHostGuards(runCtx, rt)
	if err := startKube(runCtx, c.Kube, mgr, rt, templates, st, c, log); err != nil { // serve_kube.go
		return err
	}

	apiSrv := api.New(log, st, mgr, templates)
	if c.MetricsToken != "" {
		apiSrv.SetMetrics(mets.Handler(c.MetricsToken))
	}
	apiSrv.SetVolumes(vols)
	if err := startEvents(runCtx, c.Events, st, mgr, fetchPolicy, apiSrv, log); err != nil { // serve_events.go
		return err
	}
	if err := startWebhookMirror(runCtx, c, st, log); err != nil { // serve_kubeevents.go
		return err
	}
	applyBounds(c.Bounds, apiSrv, templates, gw)
	go sweepUploads(runCtx, templates, c.Bounds.UploadTTL, log)
	// Build steps run as sandboxes of the team that asked, through the
	// manager; builds in flight at the last stop are marked failed here.
	builds, err := template.NewBuilds(ctx, templates, mgr, log)
	if err != nil {
		return err
	}
	builds.SetObserver(mets.BuildDone)
	builds.SetWaitingPerTeam(c.Bounds.BuildRequests)
	apiSrv.SetBuilds(builds)
	apiSrv.SetTunneler(gw)
	proxies, err := parseTrustedProxies(c.TrustedProxies)
	if err != nil {
		return err
	}
	// One count of failed credential checks per client, API and data plane.
	guesses := authlimit.New(authlimit.Options{TrustedProxies: proxies})
	apiSrv.SetAuthLimiter(guesses)
	gw.SetAuthLimiter(guesses)
	ln, err := listen(ctx, c.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	// MCP tools call this very listener with the caller's key, so they go
	// through the API and gateway like any SDK.
	apiSrv.SetMCP(mcpserver.Handler(mcpserver.HTTPConfig{SelfURL: mcpserver.LoopbackURL(ln.Addr()), Domain: c.Net.Domain, PortOrigin: gw.PortOrigin, Log: log}))
	apiSrv.SetPortOrigin(gw.PortOrigin)
	// The dashboard's terminal and files go through the gateway like any
	// client's sandbox traffic.
	apiSrv.SetDataPlane(gw.Handler(http.NotFoundHandler()))
	handler := gw.Handler(clusterFeed(c, tokenSecret, st, apiSrv.Handler(), log)) // serve_kubeevents.go
	servers := []*http.Server{{Handler: handler, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 640 * time.Second}}
	listeners := []net.Listener{ln}
	if c.DataPlaneListen != "" {
		dln, err := listen(ctx, c.DataPlaneListen)
		if err != nil {
			return fmt.Errorf("--data-plane-listen: %w", err)
		}
		onlySandboxes := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"code":404,"message":"this address serves sandbox traffic only: a Host <port>-<sandboxID>.<domain>, or E2b-Sandbox-Id and E2b-Sandbox-Port headers"}`, http.StatusNotFound)
		})
		servers = append(servers, &http.Server{Handler: gw.Handler(onlySandboxes), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 640 * time.Second})
		listeners = append(listeners, dln)
	}
	if c.MetricsListen != "" {
		// The operator's own address: no token asked.
		mln, err := listen(ctx, c.MetricsListen)
		if err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", mets.Handler(""))
		servers = append(servers, &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second})
		listeners = append(listeners, mln)
	}
	// Ports are served on hosts of their own (<port>-<id>.<domain>), over
	// the TLS listener when there is one.
	gwOpts := gateway.Options{Domain: c.Net.Domain}
	known := func(id string) bool { sb, err := mgr.Get(ctx, "", id); return err == nil && sb.BuildID == "" }
	if srv, tln, am, err := c.Net.tlsServer(ctx, handler, c.DataDir, known, log); err != nil {
		return err
	} else if srv != nil {
		if am != nil {
			go am.Run(ctx, 10*time.Minute)
		}
		servers, listeners = append(servers, srv), append(listeners, tln)
		if a, ok := tln.Addr().(*net.TCPAddr); ok {
			gwOpts.TLSPort = a.Port
		}
	}
	gw.SetOptions(gwOpts)
	errc := make(chan error, len(servers))
	for i, srv := range servers {
		go func() { errc <- srv.Serve(listeners[i]) }()
	}
	if c.LogFormat == "json" {
		// Output goes to a log collector: records only, and never the key.
		log.Info("agentbox is ready", "apiURL", "http://"+ln.Addr().String(), "apiKeyFile", filepath.Join(c.DataDir, "apikey"))
	} else {
		scheme, domain := gw.PortOrigin(&http.Request{Host: ln.Addr().String(), Header: http.Header{}})
		printBanner(out, "http://"+ln.Addr().String(), scheme+"://<port>-<sandboxID>."+domain+"/", key, c.DataDir, os.Args[0])
	}
	log.Info("agentbox serving", "listen", ln.Addr().String(), "data-dir", c.DataDir, "templates", c.TemplateDir, "envd", envd)

	select {
	case err := <-errc:
		return fmt.Errorf("server stopped: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down; sandboxes keep running and are re-adopted at the next start")
	shutdownServers(servers, c.ShutdownGrace, gw.Drain, log) // serve_shutdown.go
	vols.Close()
	bundles.Close()
	return nil
}

// Server CPU weight: twice the sandboxes' parent (internal/runtime/bundle,
// cgroupparent.go), so the API, gateway and envd traffic keep two thirds of
// a CPU all sandboxes together contend for.
const (
	serverCPUSharesV1 = 2 * bundle.ParentCPUSharesV1
	serverCPUWeightV2 = 2 * bundle.ParentCPUWeightV2
)

// placeServer moves the server process (every thread) into a CPU cgroup of
// its own, <instance>-server, weighing twice the sandboxes' parent. The
// commands it starts (runc, CRIU, builds) start there too; runc moves a
// sandbox into the sandbox's own cgroup. Where that is impossible the
// server runs on where it is, and says so.
func placeServer(instance string, log *slog.Logger) {
	dir, weightFile, weight := filepath.Join("/sys/fs/cgroup/cpu", instance+"-server"), "cpu.shares", serverCPUSharesV1
	if bundle.IsCgroupV2() {
		dir, weightFile, weight = filepath.Join("/sys/fs/cgroup", instance+"-server"), "cpu.weight", serverCPUWeightV2
	}
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, weightFile), []byte(strconv.Itoa(weight)), 0o644)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
	}
	if err != nil {
		log.Warn("the server keeps the CPU weight of the cgroup it was started in; sandboxes may slow it down", "cgroup", dir, "err", err)
	}
}

// privateDataDir creates the data dir 0700 and takes group and other bits
// off what an older version left readable in it: the directory itself (the
// runtime gives it o+x again when user-namespaced sandboxes must pass
// through), the API key file and the snapshot store. The database files are
// store.Open's, the template store's NewStore's.
func privateDataDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	for _, p := range []struct {
		name string
		mode os.FileMode
	}{{"", 0o700}, {"apikey", 0o600}, {"snapshots", 0o700}, {"volumes", 0o700}} {
		path := filepath.Join(dir, p.name)
		stat := os.Lstat
		if p.name == "" {
			stat = os.Stat // the data dir itself may be a symlink the operator made
		}
		fi, err := stat(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("--data-dir: %s is a symlink; the server's files must be its own", path)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(path, p.mode); err != nil {
				return fmt.Errorf("--data-dir: make %s private: %w", path, err)
			}
		}
	}
	return nil
}

// firstKey makes sure a team and a key exist. On the very first start it
// creates one and writes it to <data-dir>/apikey (0600); it returns the key
// from that file if it is there.
func firstKey(ctx context.Context, st *store.Store, dataDir string) (string, error) {
	path := filepath.Join(dataDir, "apikey")
	keys, err := st.ListAPIKeys(ctx)
	if err != nil {
		return "", err
	}
	if len(keys) > 0 {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", nil // a key exists but its file was removed: fine
		}
		return strings.TrimSpace(string(b)), nil
	}
	team, err := st.EnsureTeam(ctx, "default")
	if err != nil {
		return "", err
	}
	plain, _, err := st.CreateAPIKey(ctx, team.ID, "first key")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(plain+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return plain, nil
}

// printBanner's examples must work when pasted into a shell: cli is the
// binary as it was started (scripts/up.sh runs bin/agentbox, not on $PATH),
// and the sandbox's hostname is escaped from the user's shell.
func printBanner(out io.Writer, url, ports, key, dataDir, cli string) {
	shown := key
	if shown == "" {
		shown = "(see " + filepath.Join(dataDir, "apikey") + " or `agentbox apikey create`)"
	}
	fmt.Fprintf(out, `
agentbox is ready.
  API URL:  %[1]s
  API key:  %[2]s   (saved in %[3]s)

Use it from the official E2B SDK (npm install e2b):
  export E2B_API_URL=%[1]s E2B_SANDBOX_URL=%[1]s E2B_VOLUME_API_URL=%[1]s E2B_API_KEY=%[2]s
  node -e "const {Sandbox}=require('e2b'); (async()=>{const s=await Sandbox.create('base'); console.log((await s.commands.run('echo hello from \$(hostname)')).stdout); await s.kill()})()"

Or the CLI:  id=$(%[5]s create base) && %[5]s exec $id -- python3 -c 'print(1)' && %[5]s kill $id
Or an agent over MCP:  %[1]s/mcp with header X-API-Key (or stdio: %[5]s mcp)
Or a browser:  %[1]s/dashboard/ (log in with the API key)
Sandbox ports:  %[4]s (each port its own origin)
`, url, shown, filepath.Join(dataDir, "apikey"), ports, cli)
}
