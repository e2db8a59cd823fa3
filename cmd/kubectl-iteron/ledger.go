package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newLedgerCmd is a placeholder until issue 5 lands the command.
func newLedgerCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ledger",
		Short: "not implemented yet (issue 5)",
		RunE: func(*cobra.Command, []string) error {
			return invalid(errors.New("ledger is not implemented yet (issue 5)"))
		},
	}
}
