package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newConvertCmd is a placeholder until issue 4 lands the command.
func newConvertCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "convert",
		Short: "not implemented yet (issue 4)",
		RunE: func(*cobra.Command, []string) error {
			return invalid(errors.New("convert is not implemented yet (issue 4)"))
		},
	}
}
