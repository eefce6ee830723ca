// Command a2actl discovers A2A agents on an MQTT v5 broker and talks to them
// over the A2A over MQTT profile.
//
//	a2actl agents [--org ORG]
//	a2actl send ORG/UNIT/AGENT "text" [--stream] [--json]
//	a2actl chat ORG/UNIT/AGENT [--state FILE]
//
// Global flags (accepted anywhere): --broker (env A2A_BROKER), --username
// (A2A_USERNAME), --password (A2A_PASSWORD), --as ORG/UNIT/AGENT (own
// identity, default {target org}/{target unit}/a2actl-<random>), --timeout,
// --json.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
