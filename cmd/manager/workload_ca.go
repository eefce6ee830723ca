package main

import (
	"fmt"
	"net/url"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// workloadBrokerCAFile is the CA file the workloads verify their broker with (the controllers'
// WorkloadBrokerCAFile): flagged (--workload-broker-ca-file), or by default the operator's own
// --broker-ca-file when the workloads' URL is a TLS one (the same broker behind both URLs, as in
// the TLS-everywhere installs). It is checked the way every SDK client will check it, so a plain
// workload URL or a file without a PEM certificate stops the operator at start instead of every
// workload at its first connection.
func workloadBrokerCAFile(workloadURL, flagged, operatorCA string) (string, error) {
	file := flagged
	if file == "" {
		u, err := url.Parse(workloadURL)
		if err != nil || !isTLSScheme(u.Scheme) {
			return "", nil
		}
		file = operatorCA
	}
	if file == "" {
		return "", nil
	}
	if _, err := a2amqtt.BrokerTLS(workloadURL, a2amqtt.TLSFiles{CA: file}); err != nil {
		return "", fmt.Errorf("--workload-broker-ca-file %s for the workloads' broker %s: %w", file, workloadURL, err)
	}
	return file, nil
}

// isTLSScheme reports whether a broker URL scheme is one the SDK connects to over TLS.
func isTLSScheme(scheme string) bool {
	switch scheme {
	case "tls", "ssl", "mqtts", "wss":
		return true
	}
	return false
}
