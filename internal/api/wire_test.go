package api

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/template"
	"github.com/agentbox/agentbox/internal/volume"
)

// TestWireJSON pins the bytes the control plane writes for each response
// shape: E2B's SDKs parse them, so a renamed field, a lost null or an empty
// value that starts (or stops) being omitted is a wire change and fails here.
func TestWireJSON(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	tok := "tt-1"
	no := false
	sb := &sandbox.Sandbox{ID: "i1", TemplateID: "tpl1", StartedAt: t0, EndAt: t0.Add(time.Minute), State: sandbox.StateRunning,
		CPUCount: 2, MemoryMB: 512, DiskMB: 1024}
	full := &sandbox.Sandbox{ID: "i2", TemplateID: "tpl1", Alias: "base", StartedAt: t0, EndAt: t0.Add(time.Minute), State: sandbox.StateRunning,
		CPUCount: 1, MemoryMB: 256, DiskMB: 512, Metadata: map[string]string{"k": "v"},
		Isolation: "runc", PIDs: 64, TmpMB: 16, Health: "unhealthy", HealthReason: "envd down"}
	network := &sandbox.NetworkSpec{
		AllowOut: []string{"example.com"}, DenyOut: []string{"0.0.0.0/0"}, AllowPublicTraffic: &no,
		Rules: map[string][]sandbox.NetworkRule{"api.example.com": {{Transform: &struct {
			Headers map[string]string `json:"headers,omitempty"`
		}{Headers: map[string]string{"Authorization": "Bearer secret", "X-Key": "${secrets.KEY}"}}}}},
		EgressProxy: &sandbox.EgressProxy{Address: "proxy:1080", Username: "u", Password: "p"},
	}
	withVolumes := *sb
	withVolumes.VolumeMounts = []sandbox.VolumeMount{{ID: "v-1", Name: "ws", Path: "/workspace"}}
	withNetwork := *full
	withNetwork.AllowInternet, withNetwork.AutoPause, withNetwork.AutoResume, withNetwork.Network = true, true, true, network
	tpl := &template.Template{ID: "tpl1", TeamID: "team-a", CreatedAt: t0, SizeBytes: 42, CPUCount: 2, MemoryMB: 512, DiskMB: 1024}
	tplFull := &template.Template{ID: "tpl2", TeamID: "team-a", Aliases: []string{"app"}, Tags: []string{"v1"}, CreatedAt: t0, CPUCount: 1, MemoryMB: 256, DiskMB: 512,
		DefaultUser: "user", DefaultWorkdir: "/home/user", Env: map[string]string{"A": "b"}, StartCmd: "serve", ReadyCmd: "true",
		ExposedPorts: []int{8080}, Isolation: "runsc", LayerIDs: []string{"l1"}, Source: "Dockerfile", BuildSeconds: 1.5}
	event := audit.Event{Seq: 7, Time: t0, SandboxID: "i1", TeamID: "team-a", APIKeyID: "k1", Kind: audit.KindProcess, Action: "start",
		Decision: "allowed", Fields: map[string]any{"cmd": "ls", "pid": 12}}
	entry := toLogEntry(event)
	buildEntry := template.LogEntry{Timestamp: t0, Level: "info", Message: "step 1"}

	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"sandbox", rest.Sandbox{SandboxID: "i1", TemplateID: "tpl1", ClientID: sandbox.ClientID, EnvdVersion: "0.6.13"},
			`{"sandboxID":"i1","templateID":"tpl1","clientID":"6532622b","envdVersion":"0.6.13","trafficAccessToken":null,"domain":null}`},
		{"sandbox with tokens", rest.Sandbox{SandboxID: "i1", TemplateID: "tpl1", Alias: "base", ClientID: sandbox.ClientID, EnvdVersion: "0.6.13",
			EnvdAccessToken: "envd-1", TrafficAccessToken: &tok},
			`{"sandboxID":"i1","templateID":"tpl1","alias":"base","clientID":"6532622b","envdVersion":"0.6.13","envdAccessToken":"envd-1","trafficAccessToken":"tt-1","domain":null}`},
		{"listed", listed(sb),
			`{"sandboxID":"i1","templateID":"tpl1","clientID":"6532622b","startedAt":"2026-03-04T05:06:07Z","endAt":"2026-03-04T05:07:07Z","state":"running","cpuCount":2,"memoryMB":512,"diskSizeMB":1024,"envdVersion":"0.6.13","metadata":{}}`},
		{"listed extensions", listed(full),
			`{"sandboxID":"i2","templateID":"tpl1","alias":"base","clientID":"6532622b","startedAt":"2026-03-04T05:06:07Z","endAt":"2026-03-04T05:07:07Z","state":"running","cpuCount":1,"memoryMB":256,"diskSizeMB":512,"envdVersion":"0.6.13","metadata":{"k":"v"},"isolation":"runc","pids":64,"tmpSizeMB":16,"health":"unhealthy","healthReason":"envd down"}`},
		{"detail", detail(sb, ""),
			`{"sandboxID":"i1","templateID":"tpl1","clientID":"6532622b","startedAt":"2026-03-04T05:06:07Z","endAt":"2026-03-04T05:07:07Z","state":"running","cpuCount":2,"memoryMB":512,"diskSizeMB":1024,"envdVersion":"0.6.13","metadata":{},"domain":null,"allowInternetAccess":false,"lifecycle":{"onTimeout":"kill","autoResume":false}}`},
		{"detail with network", detail(&withNetwork, "envd-1"),
			`{"sandboxID":"i2","templateID":"tpl1","alias":"base","clientID":"6532622b","startedAt":"2026-03-04T05:06:07Z","endAt":"2026-03-04T05:07:07Z","state":"running","cpuCount":1,"memoryMB":256,"diskSizeMB":512,"envdVersion":"0.6.13","metadata":{"k":"v"},"isolation":"runc","pids":64,"tmpSizeMB":16,"health":"unhealthy","healthReason":"envd down","envdAccessToken":"envd-1","domain":null,"allowInternetAccess":true,"lifecycle":{"onTimeout":"pause","autoResume":true},"network":{"allowOut":["example.com"],"denyOut":["0.0.0.0/0"],"allowPublicTraffic":false,"rules":{"api.example.com":[{"transform":{"headers":{"Authorization":"Bear****","X-Key":"${secrets.KEY}"}}}]},"egressProxy":{"address":"proxy:1080","username":"u"}}}`},
		{"metric", rest.SandboxMetric{Timestamp: t0, TimestampUnix: t0.Unix(), CPUCount: 2, CPUUsedPct: 12.5, MemUsed: 1 << 20, MemTotal: 1 << 30, MemCache: 0, DiskUsed: 5, DiskTotal: 10},
			`{"timestamp":"2026-03-04T05:06:07Z","timestampUnix":1772600767,"cpuCount":2,"cpuUsedPct":12.5,"memUsed":1048576,"memTotal":1073741824,"memCache":0,"diskUsed":5,"diskTotal":10}`},
		{"template", templateOut(tpl, "team-b"),
			`{"templateID":"tpl1","buildID":"` + template.BuildRef(tpl) + `","buildStatus":"ready","cpuCount":2,"memoryMB":512,"diskSizeMB":1024,"envdVersion":"0.6.13","public":true,"aliases":[],"names":[],"createdAt":"2026-03-04T05:06:07Z","updatedAt":"2026-03-04T05:06:07Z","createdBy":null,"lastSpawnedAt":null,"spawnCount":0,"buildCount":1,"sizeBytes":42,"tags":[]}`},
		{"template extensions", templateOut(tplFull, "team-a"),
			`{"templateID":"tpl2","buildID":"` + template.BuildRef(tplFull) + `","buildStatus":"ready","cpuCount":1,"memoryMB":256,"diskSizeMB":512,"envdVersion":"0.6.13","public":false,"aliases":["app"],"names":["app"],"createdAt":"2026-03-04T05:06:07Z","updatedAt":"2026-03-04T05:06:07Z","createdBy":null,"lastSpawnedAt":null,"spawnCount":0,"buildCount":1,"sizeBytes":0,"tags":["v1"],"defaultUser":"user","defaultWorkdir":"/home/user","env":{"A":"b"},"startCmd":"serve","readyCmd":"true","exposedPorts":[8080],"isolation":"runsc","layers":["l1"],"source":"Dockerfile","buildSeconds":1.5}`},
		{"error", rest.Error{Code: 404, Message: "sandbox \"x\" not found"},
			`{"code":404,"message":"sandbox \"x\" not found"}`},
		{"fork results", []rest.ForkResult{{Sandbox: &rest.Sandbox{SandboxID: "i3", TemplateID: "tpl1", ClientID: sandbox.ClientID, EnvdVersion: "0.6.13"}},
			{Error: &rest.Error{Code: 429, Message: "quota"}}},
			`[{"sandbox":{"sandboxID":"i3","templateID":"tpl1","clientID":"6532622b","envdVersion":"0.6.13","trafficAccessToken":null,"domain":null}},{"error":{"code":429,"message":"quota"}}]`},
		{"listed with volumes", listed(&withVolumes),
			`{"sandboxID":"i1","templateID":"tpl1","clientID":"6532622b","startedAt":"2026-03-04T05:06:07Z","endAt":"2026-03-04T05:07:07Z","state":"running","cpuCount":2,"memoryMB":512,"diskSizeMB":1024,"envdVersion":"0.6.13","metadata":{},"volumeMounts":[{"name":"ws","path":"/workspace"}]}`},
		{"volume", volumeOf(store.Volume{ID: "v-1", Name: "ws", SizeMB: 64}),
			`{"volumeID":"v-1","name":"ws","sizeMB":64}`},
		{"volume and token", rest.VolumeAndToken{VolumeID: "v-1", Name: "ws", Token: "vol1.1.ab", SizeMB: 64},
			`{"volumeID":"v-1","name":"ws","token":"vol1.1.ab","sizeMB":64}`},
		{"volume entry", entryOf(volume.Entry{Name: "l", Type: volume.TypeSymlink, Path: "/d/l", Size: 3, Mode: 0o777, UID: 1000, GID: 1000, Atime: t0, Mtime: t0, Ctime: t0, Target: "../x"}),
			`{"name":"l","type":"symlink","path":"/d/l","size":3,"mode":511,"uid":1000,"gid":1000,"atime":"2026-03-04T05:06:07Z","mtime":"2026-03-04T05:06:07Z","ctime":"2026-03-04T05:06:07Z","target":"../x"}`},
		{"snapshot", snapshotOut(&sandbox.Snapshot{ID: "snap1"}),
			`{"snapshotID":"snap1:default","names":["snap1:default"]}`},
		{"log entry", entry,
			`{"timestamp":"2026-03-04T05:06:07Z","level":"info","message":"process start: ls pid=12","fields":{"action":"start","apiKeyID":"k1","cmd":"ls","decision":"allowed","kind":"process","pid":"12","seq":"7"}}`},
		{"logs v2", rest.SandboxLogsV2{Logs: []rest.SandboxLogEntry{entry}},
			`{"logs":[{"timestamp":"2026-03-04T05:06:07Z","level":"info","message":"process start: ls pid=12","fields":{"action":"start","apiKeyID":"k1","cmd":"ls","decision":"allowed","kind":"process","pid":"12","seq":"7"}}]}`},
		{"logs v1", rest.SandboxLogs{Logs: []rest.SandboxLog{{Timestamp: t0, Line: "x"}}, LogEntries: []rest.SandboxLogEntry{}},
			`{"logEntries":[],"logs":[{"timestamp":"2026-03-04T05:06:07Z","line":"x"}]}`},
		{"template alias", rest.TemplateAliasResponse{TemplateID: "tpl1", Public: false},
			`{"public":false,"templateID":"tpl1"}`},
		{"build requested", rest.TemplateRequestResponseV3{TemplateID: "tpl1", BuildID: "b1", Names: []string{"app:default"}, Tags: []string{"default", "v1"}, Aliases: []string{"app"}, Public: false},
			`{"aliases":["app"],"buildID":"b1","names":["app:default"],"public":false,"tags":["default","v1"],"templateID":"tpl1"}`},
		{"upload present", rest.TemplateBuildFileUpload{Present: true},
			`{"present":true}`},
		{"upload link", rest.TemplateBuildFileUpload{Present: false, URL: "http://h/templates/uploads/t", Headers: &map[string]string{}},
			`{"headers":{},"present":false,"url":"http://h/templates/uploads/t"}`},
		{"tags assigned", rest.AssignedTemplateTags{BuildID: "b1", Tags: []string{"v2"}},
			`{"buildID":"b1","tags":["v2"]}`},
		{"build status", buildInfo(&template.BuildStatus{TemplateID: "tpl1", BuildID: "b1", Status: "error", LogEntries: []template.LogEntry{buildEntry}, Logs: []string{},
			Reason: &template.Reason{Message: "RUN failed", Step: "2", LogEntries: []template.LogEntry{{Timestamp: t0, Level: "error", Message: "exit 1", Step: "2"}}}}),
			`{"templateID":"tpl1","buildID":"b1","status":"error","logEntries":[{"timestamp":"2026-03-04T05:06:07Z","level":"info","message":"step 1"}],"logs":[],"reason":{"message":"RUN failed","step":"2","logEntries":[{"timestamp":"2026-03-04T05:06:07Z","level":"error","message":"exit 1","step":"2"}]}}`},
		{"build running", buildInfo(&template.BuildStatus{TemplateID: "tpl1", BuildID: "b1", Status: "building", LogEntries: []template.LogEntry{}, Logs: []string{}}),
			`{"templateID":"tpl1","buildID":"b1","status":"building","logEntries":[],"logs":[]}`},
		{"build logs", rest.TemplateBuildLogsResponse{Logs: buildLog([]template.LogEntry{buildEntry})},
			`{"logs":[{"timestamp":"2026-03-04T05:06:07Z","level":"info","message":"step 1"}]}`},
		{"build logs none kept", rest.TemplateBuildLogsResponse{Logs: buildLog(nil)},
			`{"logs":null}`},
		{"template tag", rest.TemplateTag{Tag: "v1", BuildID: "b1", CreatedAt: t0.Format("2006-01-02T15:04:05.000Z")},
			`{"tag":"v1","buildID":"b1","createdAt":"2026-03-04T05:06:07.000Z"}`},
		{"secret", secretInfo(store.SecretInfo{Name: "KEY", CreatedAt: t0, UpdatedAt: t0}),
			`{"name":"KEY","createdAt":"2026-03-04T05:06:07Z","updatedAt":"2026-03-04T05:06:07Z"}`},
		{"secret described", secretInfo(store.SecretInfo{Name: "KEY", Description: "d", CreatedAt: t0, UpdatedAt: t0}),
			`{"name":"KEY","description":"d","createdAt":"2026-03-04T05:06:07Z","updatedAt":"2026-03-04T05:06:07Z"}`},
		{"pool", poolStats(sandbox.PoolStats{Template: "base", TemplateID: "tpl1", Ready: 1, Filling: 2, Min: 1, Target: 3, Hits: 4, Misses: 5}),
			`{"template":"base","templateID":"tpl1","ready":1,"filling":2,"min":1,"target":3,"hits":4,"misses":5}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			if err := json.NewEncoder(&b).Encode(tc.v); err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSuffix(b.String(), "\n"); got != tc.want {
				t.Errorf("wire changed:\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}
