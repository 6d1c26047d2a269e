package main

import (
	"fmt"
	"os"
	"testing"
)

// The test binary is the template store's own binary (os.Executable): it
// runs the hooks the store starts, such as the confined unpacker.
func TestMain(m *testing.M) {
	if len(os.Args) >= 3 && os.Args[1] == "__hook" {
		if err := runHook(os.Args[2], os.Args[3:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
