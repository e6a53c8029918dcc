package main

import (
	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
)

// newEnvHelpTopic is `meshagent help env`: the table of every environment
// variable the agent reads (config.Vars), sorted, with its default, the
// service it feeds and its meaning (#26). A help topic, not a command: it
// runs nothing.
func newEnvHelpTopic() *cobra.Command {
	c := &cobra.Command{
		Use:   "env",
		Short: "Every environment variable the agent reads: default, service, meaning",
	}
	c.SetHelpFunc(func(c *cobra.Command, _ []string) {
		if err := config.WriteTable(c.OutOrStdout()); err != nil {
			c.PrintErrln(err)
		}
	})
	return c
}
