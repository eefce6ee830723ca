// Package controlplane runs kube-controller-manager next to a kube-apiserver started by envtest
// (cmd/devstack, and the envtest suites that need what a cluster's controllers do): garbage
// collection of owned objects, namespace deletion, ClusterRole aggregation, so that what works in
// `make dev` and the tests works on a cluster. The binary is built from source with the rest of
// the control plane (hack/build-control-plane.sh, next to kube-apiserver in KUBEBUILDER_ASSETS).
package controlplane

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ControllerManagerBinary is kube-controller-manager's file name in the assets folder.
const ControllerManagerBinary = "kube-controller-manager"

// DefaultControllers are what a cluster does to objects that nothing else here does: collect what
// an owner's deletion leaves (a deleted Agent's Secret and Deployment), finish deleting namespaces,
// aggregate ClusterRoles (the project's roles into admin/edit/view), and give every namespace its
// default ServiceAccount. The Deployment and ReplicaSet controllers are left out: without a
// scheduler and a kubelet they would only create Pods that never run.
var DefaultControllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	"clusterrole-aggregation-controller",
	"serviceaccount-controller",
}

// ControllerManagerConfig configures StartControllerManager.
type ControllerManagerConfig struct {
	// Binary is kube-controller-manager (e.g. filepath.Join(assets, ControllerManagerBinary)).
	Binary string
	// Config is how it reaches the API server (an admin: it acts on every namespace).
	Config *rest.Config
	// Dir holds its kubeconfig (kube-controller-manager.kubeconfig); it must exist.
	Dir string
	// Controllers to run (default DefaultControllers).
	Controllers []string
	// Log receives its output (default: discarded).
	Log io.Writer
	// StartTimeout bounds the wait for its /healthz (default 1 minute).
	StartTimeout time.Duration
}

// ControllerManager is a running kube-controller-manager.
type ControllerManager struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// StartControllerManager starts kube-controller-manager in its own process group, killed with
// SIGKILL if this process dies first (Pdeathsig), and waits until it is healthy.
func StartControllerManager(ctx context.Context, cfg ControllerManagerConfig) (*ControllerManager, error) {
	if _, err := os.Stat(cfg.Binary); err != nil {
		return nil, fmt.Errorf("kube-controller-manager: %w (hack/build-control-plane.sh builds it)", err)
	}
	kubeconfig := filepath.Join(cfg.Dir, ControllerManagerBinary+".kubeconfig")
	if err := writeKubeconfig(cfg.Config, kubeconfig); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	controllers := cfg.Controllers
	if len(controllers) == 0 {
		controllers = DefaultControllers
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--controllers=" + strings.Join(controllers, ","),
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(cfg.Dir, "kube-controller-manager-certs"),
		// Each controller with its own ServiceAccount would need the token controller and a
		// signing key; the admin credentials do for a local control plane.
		"--use-service-account-credentials=false",
		"--concurrent-gc-syncs=20",
		"--v=1",
	}
	cmd := exec.Command(cfg.Binary, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out := cfg.Log
	if out == nil {
		out = io.Discard
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start kube-controller-manager: %w", err)
	}
	cm := &ControllerManager{cmd: cmd, done: make(chan struct{})}
	go func() {
		cm.err = cmd.Wait()
		close(cm.done)
	}()
	timeout := cfg.StartTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	if err := cm.waitHealthy(ctx, port, timeout); err != nil {
		_ = cm.Stop()
		return nil, err
	}
	return cm, nil
}

// Pid is the process's id.
func (c *ControllerManager) Pid() int { return c.cmd.Process.Pid }

// Done is closed when the process has exited.
func (c *ControllerManager) Done() <-chan struct{} { return c.done }

// Stop sends SIGTERM and, after 5 s, SIGKILL; it returns once the process is gone. Safe to call
// more than once.
func (c *ControllerManager) Stop() error {
	select {
	case <-c.done:
		return nil
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	return nil
}

func (c *ControllerManager) waitHealthy(ctx context.Context, port int, timeout time.Duration) error {
	// Its serving certificate is self-signed; /healthz says nothing secret.
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // local health probe
	url := fmt.Sprintf("https://127.0.0.1:%d/healthz", port)
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-c.done:
			return fmt.Errorf("kube-controller-manager exited at start: %v", c.err)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		resp, err := hc.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/healthz: %s", resp.Status)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kube-controller-manager not healthy after %s: %w", timeout, last)
}

func writeKubeconfig(cfg *rest.Config, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile, InsecureSkipTLSVerify: cfg.Insecure}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData,
		ClientCertificate: cfg.CertFile, ClientKey: cfg.KeyFile, Token: cfg.BearerToken}
	kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "admin"}
	kc.CurrentContext = "local"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kube-controller-manager kubeconfig: %w", err)
	}
	return os.Chmod(path, 0o600)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
