package sandbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/template"
)

func TestResolveLimits(t *testing.T) {
	tpl := &template.Template{CPUCount: 2, MemoryMB: 1024, DiskMB: 10240}
	tests := []struct {
		name    string
		req     Limits
		want    Limits
		wantErr string // substring of the error; "" = no error
	}{
		{"template defaults", Limits{}, Limits{CPUCount: 2, MemoryMB: 1024, DiskMB: 10240, PIDs: DefaultPIDs}, ""},
		{"overrides", Limits{CPUCount: 1, MemoryMB: 512, DiskMB: 2048, PIDs: 100, TmpMB: 64}, Limits{CPUCount: 1, MemoryMB: 512, DiskMB: 2048, PIDs: 100, TmpMB: 64}, ""},
		{"memory over quota", Limits{MemoryMB: 999999}, Limits{}, "memoryMB: 999999 MiB is over the team quota of 16384"},
		{"cpu over quota", Limits{CPUCount: 64}, Limits{}, "cpuCount: 64 CPUs is over the team quota of 8"},
		{"disk over quota", Limits{DiskMB: 1 << 20}, Limits{}, "diskSizeMB"},
		{"pids below minimum", Limits{PIDs: 2}, Limits{}, "pids: 2 processes is below the minimum"},
		{"negative", Limits{TmpMB: -1}, Limits{}, "tmpSizeMB: must not be negative"},
		{"tmp over memory", Limits{MemoryMB: 256, TmpMB: 512}, Limits{}, "/tmp is kept in memory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resolveLimits(tt.req, tpl, DefaultQuota())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("err = %v, want invalid argument containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestResolveIsolation(t *testing.T) {
	m := &starter{} // no runtime: only the container tier exists
	tests := []struct {
		name    string
		req     CreateRequest
		tpl     template.Template
		want    string
		wantErr string
	}{
		{"default", CreateRequest{}, template.Template{}, IsolationContainer, ""},
		{"field", CreateRequest{Isolation: "container"}, template.Template{Isolation: "gvisor"}, IsolationContainer, ""},
		{"metadata", CreateRequest{Metadata: map[string]string{MetadataIsolation: "kvm"}}, template.Template{}, "", `"kvm" is not a tier; use one of container, gvisor`},
		{"template", CreateRequest{}, template.Template{Isolation: "gvisor"}, "", "only runs"},
		{"unknown", CreateRequest{Isolation: "vm"}, template.Template{}, "", "not a tier"},
		{"microvm", CreateRequest{Metadata: map[string]string{MetadataIsolation: "microvm"}}, template.Template{}, "", "only runs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := m.resolveIsolation(tt.req, &tt.tpl)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("err = %v, want invalid argument containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestLazyResumeMetadata(t *testing.T) {
	for _, tc := range []struct {
		md   map[string]string
		want runtime.Lazy
	}{
		{nil, runtime.LazyAuto},
		{map[string]string{MetadataLazyResume: "on"}, runtime.LazyAlways},
		{map[string]string{MetadataLazyResume: "off"}, runtime.LazyNever},
		{map[string]string{MetadataLazyResume: "yes"}, runtime.LazyAuto},
	} {
		if got := lazyResume(tc.md); got != tc.want {
			t.Errorf("lazyResume(%v) = %v, want %v", tc.md, got, tc.want)
		}
	}
}
