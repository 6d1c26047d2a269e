package api

import (
	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/template"
)

// The request and response bodies are the types generated from
// api/openapi/agentbox.yaml (package rest). The domain types below them
// are persisted and have their own lives, so they are converted here, at
// the edge, instead of being served as they are.

// networkSpec is the policy a create request asks for.
func networkSpec(n *rest.SandboxNetworkConfig) *sandbox.NetworkSpec {
	if n == nil {
		return nil
	}
	return &sandbox.NetworkSpec{
		AllowOut: n.AllowOut, DenyOut: n.DenyOut, AllowPublicTraffic: n.AllowPublicTraffic, MaskRequestHost: n.MaskRequestHost,
		HTTPSPorts: n.HTTPSPorts, Rules: networkRules(n.Rules), EgressProxy: egressProxy(n.EgressProxy),
	}
}

// networkConfig is the wire form of a sandbox's policy. Its maps are
// copies, so a caller may mask them.
func networkConfig(n *sandbox.NetworkSpec) *rest.SandboxNetworkConfig {
	if n == nil {
		return nil
	}
	c := &rest.SandboxNetworkConfig{
		AllowOut: n.AllowOut, DenyOut: n.DenyOut, AllowPublicTraffic: n.AllowPublicTraffic, MaskRequestHost: n.MaskRequestHost,
		HTTPSPorts: n.HTTPSPorts,
	}
	if p := n.EgressProxy; p != nil {
		c.EgressProxy = &rest.SandboxEgressProxyConfig{Address: p.Address, Username: p.Username, Password: p.Password}
	}
	if n.Rules != nil {
		c.Rules = make(map[string][]rest.SandboxNetworkRule, len(n.Rules))
		for d, rules := range n.Rules {
			out := make([]rest.SandboxNetworkRule, 0, len(rules))
			for _, r := range rules {
				wr := rest.SandboxNetworkRule{AllowPlainHTTP: r.AllowPlainHTTP}
				if r.Transform != nil {
					wr.Transform = &rest.SandboxNetworkTransform{}
					if r.Transform.Headers != nil {
						wr.Transform.Headers = make(map[string]string, len(r.Transform.Headers))
						for k, v := range r.Transform.Headers {
							wr.Transform.Headers[k] = v
						}
					}
				}
				out = append(out, wr)
			}
			c.Rules[d] = out
		}
	}
	return c
}

func networkRules(in map[string][]rest.SandboxNetworkRule) map[string][]sandbox.NetworkRule {
	if in == nil {
		return nil
	}
	out := make(map[string][]sandbox.NetworkRule, len(in))
	for d, rules := range in {
		var rs []sandbox.NetworkRule
		if rules != nil {
			rs = make([]sandbox.NetworkRule, 0, len(rules))
		}
		for _, r := range rules {
			nr := sandbox.NetworkRule{AllowPlainHTTP: r.AllowPlainHTTP}
			if r.Transform != nil {
				nr.Transform = &struct {
					Headers map[string]string `json:"headers,omitempty"`
				}{Headers: r.Transform.Headers}
			}
			rs = append(rs, nr)
		}
		out[d] = rs
	}
	return out
}

func egressProxy(p *rest.SandboxEgressProxyConfig) *sandbox.EgressProxy {
	if p == nil {
		return nil
	}
	return &sandbox.EgressProxy{Address: p.Address, Username: p.Username, Password: p.Password}
}

func secretInfo(i store.SecretInfo) rest.SecretInfo {
	return rest.SecretInfo{Name: i.Name, Description: i.Description, CreatedAt: i.CreatedAt, UpdatedAt: i.UpdatedAt}
}

func poolStats(p sandbox.PoolStats) rest.PoolStats {
	return rest.PoolStats{Template: p.Template, TemplateID: p.TemplateID, Ready: p.Ready, Filling: p.Filling, Min: p.Min,
		Target: p.Target, Hits: p.Hits, Misses: p.Misses}
}

// buildLog keeps nil a nil list and [] an empty one: both are on the wire.
func buildLog(in []template.LogEntry) []rest.BuildLogEntry {
	if in == nil {
		return nil
	}
	out := make([]rest.BuildLogEntry, 0, len(in))
	for _, e := range in {
		out = append(out, rest.BuildLogEntry{Timestamp: e.Timestamp, Level: e.Level, Message: e.Message, Step: e.Step})
	}
	return out
}

func buildInfo(st *template.BuildStatus) rest.TemplateBuildInfo {
	out := rest.TemplateBuildInfo{TemplateID: st.TemplateID, BuildID: st.BuildID, Status: st.Status, LogEntries: buildLog(st.LogEntries), Logs: st.Logs}
	if r := st.Reason; r != nil {
		out.Reason = &rest.BuildStatusReason{Message: r.Message, Step: r.Step, LogEntries: buildLog(r.LogEntries)}
	}
	return out
}
