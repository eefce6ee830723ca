// Package interop runs an A2A stack nobody here wrote — the official A2A JS SDK (@a2a-js/sdk
// 1.3.0) over MQTT.js 5.16 — against a2a-fleet (issue 12 items 4–7): a JS SDK responder and a JS
// SDK requester, and the Go SDK on the other side, through the conversation service, on
// Mosquitto 2.0.11 with dynsec and on the embedded broker. The stack is the e2e suite's: the
// control plane (test/testenv), a broker, the operator with gating on and the conversation
// service, in process. The JS side is the SDK plus the few lines of MQTT <-> JSON-RPC glue in
// js/mqtt-a2a.mjs; its packages are installed by hack/install-node-deps.sh (pinned, cached in
// bin/node-deps), which TestMain runs.
package interop

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

var (
	cp      *testenv.ControlPlane
	restCfg *rest.Config
	k8s     client.Client
	// nodeDeps is the directory with node_modules (hack/install-node-deps.sh --print-dir).
	nodeDeps string
)

const repoRoot = "../.."

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel + 1)))
	// The JS packages first: a missing npm or registry fails the suite here, with the script's
	// message, instead of as a confusing node error later.
	install := exec.Command("bash", filepath.Join(repoRoot, "hack", "install-node-deps.sh"))
	install.Stdout, install.Stderr = os.Stderr, os.Stderr
	if err := install.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "interop: hack/install-node-deps.sh failed: %v\n", err)
		os.Exit(1)
	}
	out, err := exec.Command("bash", filepath.Join(repoRoot, "hack", "install-node-deps.sh"), "--print-dir").Output()
	if err != nil {
		fmt.Fprintf(os.Stderr, "interop: node deps dir: %v\n", err)
		os.Exit(1)
	}
	nodeDeps = string(out[:len(out)-1])
	testenv.Main(m, repoRoot, func(c *testenv.ControlPlane) error {
		cp, restCfg, k8s = c, c.Config, c.Client
		return nil
	})
}
