package template

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// buildLayered builds def, which has a Base, as layers over the base's
// template: one layer installing def's packages with apt, one per Run
// command. The base is built first if needed; its rootfs stays one copy
// however many templates sit on it. The template gets def's ID, so
// builtins keep content-derived IDs whether layered or not.
func (s *Store) buildLayered(ctx context.Context, def Definition, id string, runner StepRunner, progress io.Writer) (*Template, error) {
	fmt.Fprintf(progress, "==> base template %s\n", def.Base.Name)
	base, err := s.Build(ctx, *def.Base, runner, progress)
	if err != nil {
		return nil, fmt.Errorf("build %s: base: %w", def.Name, err)
	}
	var steps []Step
	if len(def.Packages) > 0 {
		steps = append(steps, Step{Op: OpRun, Args: []string{aptInstallScript(def.Packages)}})
	}
	for _, c := range def.Run {
		steps = append(steps, Step{Op: OpRun, Args: []string{c}})
	}
	for _, k := range slices.Sorted(maps.Keys(def.Env)) {
		steps = append(steps, Step{Op: OpEnv, Args: []string{k, def.Env[k]}})
	}
	startCmd, readyCmd := def.StartCmd, def.ReadyCmd
	t, err := s.BuildFromSpec(ctx, BuildSpec{
		Name: def.Name, ID: id, From: base.ID, Steps: steps,
		StepUser: "root", StartCmd: &startCmd, ReadyCmd: &readyCmd,
		CPUCount: def.CPUCount, MemoryMB: def.MemoryMB, DiskMB: def.DiskMB,
		Source: "builtin " + def.Name + " on " + def.Base.Name, Definition: &def,
		Runner: runner, BuildMemoryMB: 4096,
	}, progress)
	if err != nil {
		return nil, fmt.Errorf("build %s: %w", def.Name, err)
	}
	return t, nil
}

// aptInstallScript installs pkgs without recommends and leaves no apt
// lists or caches in the layer (the base's are dropped too, so the layer
// would otherwise carry a fresh copy of them).
func aptInstallScript(pkgs []string) string {
	install := "apt-get install -y --no-install-recommends " + strings.Join(pkgs, " ")
	if slices.ContainsFunc(pkgs, func(p string) bool { return strings.Contains(p, "jdk") || strings.Contains(p, "jre") }) {
		// The JDK's postinst links its man pages with update-alternatives,
		// which fails when /usr/share/man/man1 is missing, as it is in a
		// rootfs whose dpkg excludes man pages. (Only then, so the steps of
		// templates without Java, and their cached layers, stay the same.)
		install = "mkdir -p /usr/share/man/man1; " + install
	}
	return strings.Join([]string{
		"set -e",
		"export DEBIAN_FRONTEND=noninteractive",
		"apt-get update -o Acquire::Languages=none",
		install,
		"apt-get clean",
		"rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/*.log /tmp/* /var/tmp/*",
	}, "; ")
}
