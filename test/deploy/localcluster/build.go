package localcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// DockerfileBuild is the Dockerfile's build command; Build uses the same flags (CGO off, -trimpath,
// stripped) and TestDockerfileBuildsWhatTheManifestsRun checks that the Dockerfile still says so.
const DockerfileBuild = `go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/manager ./cmd/conversation-service`

// Build compiles packages (import paths relative to the module, e.g. ./cmd/manager) into dir with
// the Dockerfile's flags.
func Build(root, dir string, packages ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	args := append([]string{"build", "-trimpath", "-ldflags=-s -w", "-o", dir + string(filepath.Separator)}, packages...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("localcluster: go build %v: %w\n%s", packages, err, out)
	}
	return nil
}

// Nonroot is the distroless nonroot user of the Dockerfile's images (USER 65532:65532).
const Nonroot = 65532

// mosquittoListener is a listener line of mosquitto.conf: the port the container listens on.
var mosquittoListener = regexp.MustCompile(`(?m)^listener[ \t]+([0-9]+)[ \t]*$`)

// DefaultImages are the images of the rendered manifests and what runs for them here: the
// Dockerfile's two targets (binaries built by Build into bin) and Debian's Mosquitto for
// eclipse-mosquitto (whose dynsec plugin lives elsewhere, and whose listeners must bind this
// pod's loopback port instead of the container's port).
func DefaultImages(bin string) map[string]Image {
	return map[string]Image{
		"a2a-fleet/operator":             {Entrypoint: []string{filepath.Join(bin, "manager")}, User: Nonroot},
		"a2a-fleet/conversation-service": {Entrypoint: []string{filepath.Join(bin, "conversation-service")}, User: Nonroot},
		"eclipse-mosquitto": {
			Files: map[string]string{"/usr/lib/mosquitto_dynamic_security.so": brokertest.DefaultDynSecPlugin},
			ConfigRewrites: func(text string, port func(int) int) string {
				return mosquittoListener.ReplaceAllStringFunc(text, func(line string) string {
					cp, _ := strconv.Atoi(mosquittoListener.FindStringSubmatch(line)[1])
					return fmt.Sprintf("listener %d 127.0.0.1", port(cp))
				})
			},
		},
	}
}

// RedisImage stands for a redis image with Debian's redis-server: the --port argument becomes
// this pod's loopback port (and it binds loopback only).
func RedisImage() Image {
	return Image{
		Entrypoint: []string{"/usr/bin/redis-server"},
		ArgRewrites: func(argv []string, port func(int) int) []string {
			out := append([]string(nil), argv...)
			for i := 0; i+1 < len(out); i++ {
				if out[i] == "--port" {
					cp, _ := strconv.Atoi(out[i+1])
					out[i+1] = strconv.Itoa(port(cp))
				}
			}
			return append(out, "--bind", "127.0.0.1")
		},
	}
}
