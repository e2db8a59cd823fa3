package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newConformanceCmd is a placeholder until issue 3 lands the command.
func newConformanceCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "conformance",
		Short: "not implemented yet (issue 3)",
		RunE: func(*cobra.Command, []string) error {
			return invalid(errors.New("conformance is not implemented yet (issue 3)"))
		},
	}
}
