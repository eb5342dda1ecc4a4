// composecheck loads a Compose file the way Docker Compose v2 does (compose-go: the
// Compose Specification's JSON schema, then interpolation and normalisation) and prints
// the project as JSON, or the loader's one-line error and exit status 1. It needs no
// Docker engine. tests/unit/test_compose.py reads its output.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: composecheck FILE")
		os.Exit(2)
	}
	options, err := cli.NewProjectOptions([]string{os.Args[1]}, cli.WithName("lakesync"), cli.WithOsEnv)
	if err != nil {
		fail(err)
	}
	loaded, err := options.LoadProject(context.Background())
	if err != nil {
		fail(err)
	}
	out, err := loaded.MarshalJSON()
	if err != nil {
		fail(err)
	}
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
