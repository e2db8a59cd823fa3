package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newPlanCmd is a placeholder until issue 4 lands the command.
func newPlanCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "plan",
		Short: "not implemented yet (issue 4)",
		RunE: func(*cobra.Command, []string) error {
			return invalid(errors.New("plan is not implemented yet (issue 4)"))
		},
	}
}
