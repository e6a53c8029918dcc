package bootstrap

// Write is what the tests render with; the agent renders with Render
// (issue 34: no production code kept for tests).

// Write produces Envoy's bootstrap: the custom config file as is, a rendered template, or the
// built-in bootstrap, written atomically to <ConfigPath>/envoy-rev.json (directory created 0700).
// The override file, if any, is read and converted to JSON for --config-yaml.
func Write(c Config) (File, error) {
	if err := c.Validate(); err != nil {
		return File{}, err
	}
	out, _, err := write(c)
	return out, err
}
