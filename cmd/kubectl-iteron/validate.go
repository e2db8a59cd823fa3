package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newValidateCmd is a placeholder until issue 4 lands the command.
func newValidateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "validate",
		Short: "not implemented yet (issue 4)",
		RunE: func(*cobra.Command, []string) error {
			return invalid(errors.New("validate is not implemented yet (issue 4)"))
		},
	}
}
