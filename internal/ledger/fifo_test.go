package ledger

import (
	"os"

	"golang.org/x/sys/unix"
)

func mkfifo(path string) error { return unix.Mkfifo(path, 0o600) }

func writeFile(path string, data []byte) error { return os.WriteFile(path, data, 0o600) }
