package sandbox

import "maps"

// mergeEnv is the template's env overlaid with the request's: a sandbox
// sees its template's ENV, and a create call can override any of it.
func mergeEnv(tpl, req map[string]string) map[string]string {
	if len(tpl) == 0 {
		return req
	}
	out := maps.Clone(tpl)
	maps.Copy(out, req)
	return out
}
