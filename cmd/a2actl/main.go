// Command a2actl discovers A2A agents on an MQTT v5 broker and talks to them
// over the A2A over MQTT profile.
//
//	a2actl agents [--org ORG]
//	a2actl send ORG/UNIT/AGENT "text" [--stream] [--json]
//	a2actl chat ORG/UNIT/AGENT [--state FILE]
//	a2actl card verify ORG/UNIT/AGENT
//	a2actl version
//
// Global flags (accepted anywhere): --broker (env A2A_BROKER), --as-agent NAME [-n NAMESPACE]
// (A2A_AS_AGENT: the Agent's credentials Secret, read through the kubeconfig), --username
// (A2A_USERNAME), --password (A2A_PASSWORD), --as ORG/UNIT/AGENT (own identity, default
// {target org}/{target unit}/a2actl-<random>), --tls-ca, --tls-cert, --tls-key (A2A_TLS_CA,
// A2A_TLS_CERT, A2A_TLS_KEY), --timeout, --json. `a2actl COMMAND -h` shows one command's
// synopsis, examples and variables. Tracing: OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set
// (internal/telemetry).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/telemetry"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	shutdownTracing, err := telemetry.Setup(ctx, "a2actl")
	if err != nil {
		fmt.Fprintf(os.Stderr, "a2actl: %v\n", err)
		os.Exit(exitUsage)
	}
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	_ = shutdownTracing(sctx)
	cancel()
	os.Exit(code)
}
