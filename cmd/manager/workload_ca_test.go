package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --workload-broker-ca-file defaults to --broker-ca-file for a TLS workload URL only, and a CA the
// workloads could not use (a plain URL, no PEM certificate) stops the operator at start.
func TestWorkloadBrokerCAFile(t *testing.T) {
	dir := t.TempDir()
	ca, _ := writePair(t, dir)
	other, _ := writePair(t, t.TempDir())
	garbage := filepath.Join(dir, "garbage.crt")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, url, flagged, operatorCA string
		want, wantErr                  string
	}{
		{"tls:// workloads default to the operator's CA", "tls://broker:8883", "", ca, ca, ""},
		{"mqtts:// too", "mqtts://broker:8883", "", ca, ca, ""},
		{"plain workloads get none", "mqtt://broker:1883", "", ca, "", ""},
		{"no CA anywhere: none", "tls://broker:8883", "", "", "", ""},
		{"no broker: none", "", "", ca, "", ""},
		{"the flag wins", "tls://broker:8883", other, ca, other, ""},
		{"the flag with a plain URL is refused", "mqtt://broker:1883", other, "", "", "plaintext"},
		{"a file without a certificate is refused", "tls://broker:8883", garbage, "", "", "no PEM certificate"},
		{"a missing file is refused", "tls://broker:8883", filepath.Join(dir, "missing.crt"), "", "", "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := workloadBrokerCAFile(tc.url, tc.flagged, tc.operatorCA)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %q, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
