package harness

// TemplateDisk is TemplateDir for a store on a filesystem of the test's own
// (a small tmpfs it fills on purpose): the harness's free-space margin,
// which protects the host's disk, does not apply to it.
func TemplateDisk(dir string) Option {
	return func(c *config) { c.templateDir, c.ownTemplateDisk = dir, true }
}
