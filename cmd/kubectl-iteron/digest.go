package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newDigestCmd is a placeholder until issue 4 lands the command.
func newDigestCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "digest",
		Short: "not implemented yet (issue 4)",
		RunE: func(*cobra.Command, []string) error {
			return invalid(errors.New("digest is not implemented yet (issue 4)"))
		},
	}
}
