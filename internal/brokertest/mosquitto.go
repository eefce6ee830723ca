package brokertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// DefaultMosquittoBin is where Debian's mosquitto package installs the broker.
const DefaultMosquittoBin = "/usr/sbin/mosquitto"

// DefaultDynSecPlugin is where Debian's mosquitto package installs the
// dynamic-security plugin.
const DefaultDynSecPlugin = "/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so"

// MosquittoOptions configures StartMosquitto. The zero value is an anonymous
// broker on a free loopback port without persistence.
type MosquittoOptions struct {
	// DenyAnonymous turns allow_anonymous off (it is on by default, and off
	// by default when DynSec is set).
	DenyAnonymous bool
	// MaxPacketSize sets max_packet_size when > 0.
	MaxPacketSize int
	// DynSec enables the dynamic-security plugin with an admin user.
	DynSec *DynSecOptions
	// Table loads the a2a-fleet decision-table plugin instead (internal/mqtt/mosqtable).
	Table *TableOptions
	// ExtraConfig is appended verbatim to the generated mosquitto.conf.
	ExtraConfig string
	// StartTimeout bounds how long to wait for the listener (default 10s).
	StartTimeout time.Duration
}

// DynSecOptions enables Mosquitto's dynamic-security plugin. The plugin's
// JSON state file is created with `mosquitto_ctrl dynsec init` in the test's
// temp dir, so the admin user can manage clients/roles over
// $CONTROL/dynamic-security/v1.
type DynSecOptions struct {
	// PluginPath defaults to DefaultDynSecPlugin.
	PluginPath string
	// AdminUser and AdminPassword default to "admin"/"admin-password".
	AdminUser     string
	AdminPassword string
	// AllowAnonymous keeps allow_anonymous true (anonymous clients then get
	// the dynsec anonymous group's rights, i.e. nothing by default).
	AllowAnonymous bool
	// WithoutSenderPlugin leaves out the a2a-fleet sender-stamp plugin, which
	// is otherwise loaded before dynsec as config/mosquitto/mosquitto.conf
	// loads it (a broker that cannot tell subscribers who published).
	WithoutSenderPlugin bool
	// SenderPluginPath defaults to SenderPluginPath().
	SenderPluginPath string
}

// TableOptions loads the a2a-fleet decision-table plugin (hack/build-mosquitto-table-plugin.sh)
// with a bootstrap admin, after the sender-stamp plugin, as config/mosquitto does with it.
type TableOptions struct {
	// PluginPath defaults to TablePluginPath().
	PluginPath string
	// AdminUser and AdminPassword default to "admin"/"admin-password".
	AdminUser     string
	AdminPassword string
	// InMemory keeps the table in memory only (no state_dir): a restart forgets it.
	InMemory bool
	// WithoutSenderPlugin leaves out the sender-stamp plugin.
	WithoutSenderPlugin bool
}

// TablePluginPath is where hack/build-mosquitto-table-plugin.sh (make mosquitto-plugin)
// builds the decision-table plugin: $A2A_MOSQUITTO_TABLE_PLUGIN, else bin/mosquitto/.
func TablePluginPath() string {
	if p := os.Getenv("A2A_MOSQUITTO_TABLE_PLUGIN"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "bin", "mosquitto", "mosquitto_a2a_fleet_table.so")
}

// TableAdmin returns the table plugin's admin credentials ("" when Table is off).
func (m *Mosquitto) TableAdmin() (user, password string) {
	if m.table == nil {
		return "", ""
	}
	return m.table.AdminUser, m.table.AdminPassword
}

// TableStateDir is the table plugin's state_dir ("" when in memory or off): a test empties
// it to restart the broker on an empty disk.
func (m *Mosquitto) TableStateDir() string {
	if m.table == nil || m.table.InMemory {
		return ""
	}
	return filepath.Join(m.dir, "table")
}

// SenderPluginPath is where hack/build-mosquitto-plugin.sh (make
// mosquitto-plugin, part of make tools-test) builds the sender-stamp plugin:
// $A2A_MOSQUITTO_SENDER_PLUGIN, else bin/mosquitto/ in the source tree.
func SenderPluginPath() string {
	if p := os.Getenv("A2A_MOSQUITTO_SENDER_PLUGIN"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "bin", "mosquitto", "mosquitto_a2a_fleet_sender.so")
}

// Mosquitto is a Mosquitto broker child process.
type Mosquitto struct {
	t       testing.TB
	bin     string
	dir     string
	conf    string
	port    int
	opts    MosquittoOptions
	mu      sync.Mutex
	cmd     *exec.Cmd
	log     *lockedBuffer
	exited  chan struct{}
	dynsec  *DynSecOptions
	table   *TableOptions
	stopped bool
}

// URL implements Broker.
func (m *Mosquitto) URL() string { return "mqtt://" + m.Addr() }

// Addr implements Broker.
func (m *Mosquitto) Addr() string { return fmt.Sprintf("127.0.0.1:%d", m.port) }

// Name implements Broker.
func (m *Mosquitto) Name() string { return "mosquitto" }

// Port is the listener port; it stays the same across Restart.
func (m *Mosquitto) Port() int { return m.port }

// ConfigPath is the generated mosquitto.conf.
func (m *Mosquitto) ConfigPath() string { return m.conf }

// DynSecAdmin returns the dynsec admin credentials ("" when DynSec is off).
func (m *Mosquitto) DynSecAdmin() (user, password string) {
	if m.dynsec == nil {
		return "", ""
	}
	return m.dynsec.AdminUser, m.dynsec.AdminPassword
}

// Log returns what the broker wrote so far (useful in failure messages).
func (m *Mosquitto) Log() string { return m.log.String() }

// PID is the running broker's process id (0 when it is not running): benchmarks read its
// /proc accounting.
func (m *Mosquitto) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil || m.cmd.Process == nil || m.stopped {
		return 0
	}
	return m.cmd.Process.Pid
}

// StartMosquitto writes a config into t.TempDir(), starts the broker
// ($MOSQUITTO_BIN or /usr/sbin/mosquitto), waits until it accepts connections
// and kills it when the test ends. A missing binary fails the test with a
// pointer to hack/install-mosquitto.sh; it is never skipped silently.
func StartMosquitto(t testing.TB, opts MosquittoOptions) *Mosquitto {
	t.Helper()
	bin := os.Getenv("MOSQUITTO_BIN")
	if bin == "" {
		bin = DefaultMosquittoBin
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("brokertest: mosquitto not found at %s (%v); install it with hack/install-mosquitto.sh or set MOSQUITTO_BIN", bin, err)
	}
	m := &Mosquitto{t: t, bin: bin, dir: t.TempDir(), opts: opts, log: &lockedBuffer{}}
	if opts.DynSec != nil {
		ds := *opts.DynSec
		if ds.PluginPath == "" {
			ds.PluginPath = DefaultDynSecPlugin
		}
		if ds.AdminUser == "" {
			ds.AdminUser = "admin"
		}
		if ds.AdminPassword == "" {
			ds.AdminPassword = "admin-password"
		}
		if ds.SenderPluginPath == "" && !ds.WithoutSenderPlugin {
			ds.SenderPluginPath = SenderPluginPath()
		}
		m.dynsec = &ds
		if err := m.initDynSec(); err != nil {
			t.Fatalf("brokertest: %v", err)
		}
	}
	if opts.Table != nil {
		to := *opts.Table
		if to.PluginPath == "" {
			to.PluginPath = TablePluginPath()
		}
		if to.AdminUser == "" {
			to.AdminUser = "admin"
		}
		if to.AdminPassword == "" {
			to.AdminPassword = "admin-password"
		}
		m.table = &to
		if _, err := os.Stat(to.PluginPath); err != nil {
			t.Fatalf("brokertest: decision-table plugin (build it with hack/build-mosquitto-table-plugin.sh, or make mosquitto-plugin): %v", err)
		}
		if !to.WithoutSenderPlugin {
			if _, err := os.Stat(SenderPluginPath()); err != nil {
				t.Fatalf("brokertest: sender-stamp plugin (build it with hack/build-mosquitto-plugin.sh, or make tools-test): %v", err)
			}
		}
	}
	t.Cleanup(m.kill)

	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		m.port = FreePort(t)
		if err := m.writeConfig(); err != nil {
			t.Fatalf("brokertest: %v", err)
		}
		if lastErr = m.start(); lastErr == nil {
			return m
		}
	}
	t.Fatalf("brokertest: start mosquitto: %v\nbroker log:\n%s", lastErr, m.Log())
	return nil
}

func (m *Mosquitto) initDynSec() error {
	ctl, err := exec.LookPath("mosquitto_ctrl")
	if err != nil {
		return fmt.Errorf("dynsec needs mosquitto_ctrl (package mosquitto-clients; hack/install-mosquitto.sh): %w", err)
	}
	if _, err := os.Stat(m.dynsec.PluginPath); err != nil {
		return fmt.Errorf("dynsec plugin: %w", err)
	}
	if !m.dynsec.WithoutSenderPlugin {
		if _, err := os.Stat(m.dynsec.SenderPluginPath); err != nil {
			return fmt.Errorf("sender-stamp plugin (build it with hack/build-mosquitto-plugin.sh, or make tools-test): %w", err)
		}
	}
	file := filepath.Join(m.dir, "dynamic-security.json")
	out, err := exec.Command(ctl, "dynsec", "init", file, m.dynsec.AdminUser, m.dynsec.AdminPassword).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mosquitto_ctrl dynsec init: %w: %s", err, out)
	}
	return nil
}

func (m *Mosquitto) writeConfig() error {
	var b strings.Builder
	fmt.Fprintf(&b, "# generated by internal/brokertest\n")
	fmt.Fprintf(&b, "listener %d 127.0.0.1\n", m.port)
	allowAnon := !m.opts.DenyAnonymous
	if m.dynsec != nil {
		allowAnon = m.dynsec.AllowAnonymous
	}
	if m.table != nil {
		allowAnon = false
	}
	// Mosquitto leaves Nagle on by default; with delayed ACKs every small
	// reply then waits ~40 ms, which would dominate latency tests.
	fmt.Fprintf(&b, "set_tcp_nodelay true\n")
	fmt.Fprintf(&b, "allow_anonymous %t\n", allowAnon)
	fmt.Fprintf(&b, "persistence false\n")
	fmt.Fprintf(&b, "log_dest stderr\n")
	// As config/mosquitto does: the log lines on $SYS/broker/log/*, where the operator reads who
	// connects and goes (internal/mqtt/presence).
	fmt.Fprintf(&b, "log_dest topic\n")
	fmt.Fprintf(&b, "log_type error\nlog_type warning\nlog_type notice\nlog_type information\n")
	// Started as root, mosquitto drops to user "mosquitto", which cannot read
	// the test's temp dir; staying root is fine for a loopback test broker.
	if os.Geteuid() == 0 {
		fmt.Fprintf(&b, "user root\n")
	}
	if m.opts.MaxPacketSize > 0 {
		fmt.Fprintf(&b, "max_packet_size %d\n", m.opts.MaxPacketSize)
	}
	if m.dynsec != nil {
		if !m.dynsec.WithoutSenderPlugin {
			// Before dynsec: its ACL callback must see every check first.
			fmt.Fprintf(&b, "plugin %s\n", m.dynsec.SenderPluginPath)
		}
		fmt.Fprintf(&b, "plugin %s\n", m.dynsec.PluginPath)
		fmt.Fprintf(&b, "plugin_opt_config_file %s\n", filepath.Join(m.dir, "dynamic-security.json"))
	}
	if m.table != nil {
		if !m.table.WithoutSenderPlugin {
			// Before the table: the sender plugin's ACL callback defers, so it must come first.
			fmt.Fprintf(&b, "plugin %s\n", SenderPluginPath())
		}
		fmt.Fprintf(&b, "plugin %s\n", m.table.PluginPath)
		fmt.Fprintf(&b, "plugin_opt_admin_username %s\n", m.table.AdminUser)
		fmt.Fprintf(&b, "plugin_opt_admin_password %s\n", m.table.AdminPassword)
		if !m.table.InMemory {
			fmt.Fprintf(&b, "plugin_opt_state_dir %s\n", m.TableStateDir())
		}
	}
	if m.opts.ExtraConfig != "" {
		b.WriteString(m.opts.ExtraConfig)
		b.WriteString("\n")
	}
	m.conf = filepath.Join(m.dir, "mosquitto.conf")
	if err := os.WriteFile(m.conf, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("write mosquitto.conf: %w", err)
	}
	return nil
}

func (m *Mosquitto) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cmd := exec.Command(m.bin, "-c", m.conf)
	cmd.Stdout = m.log
	cmd.Stderr = m.log
	// Own process group so a test's Ctrl-C does not race our cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec %s: %w", m.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	m.cmd, m.exited, m.stopped = cmd, exited, false

	timeout := m.opts.StartTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- waitForListener(ctx, m.Addr()) }()
	select {
	case err := <-done:
		if err != nil {
			_ = cmd.Process.Kill()
			<-exited
			return err
		}
		return nil
	case <-exited:
		cancel()
		return errors.New("mosquitto exited during startup")
	}
}

// Stop terminates the broker gracefully (SIGTERM) and waits for it to exit.
// Connected clients see their connection dropped; use Restart to bring the
// same port back.
func (m *Mosquitto) Stop() { m.signal(syscall.SIGTERM) }

// Pause freezes the broker process (SIGSTOP): connections stay open, nothing
// is read or answered, as with a broker stalled by its host. Resume undoes it.
func (m *Mosquitto) Pause() { m.deliver(syscall.SIGSTOP) }

// Resume continues a paused broker (SIGCONT).
func (m *Mosquitto) Resume() { m.deliver(syscall.SIGCONT) }

// deliver sends sig to the running broker without waiting for it to exit.
func (m *Mosquitto) deliver(sig syscall.Signal) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil && !m.stopped {
		_ = m.cmd.Process.Signal(sig)
	}
}

// Kill terminates the broker with SIGKILL (a crash: nothing is flushed).
func (m *Mosquitto) Kill() { m.signal(syscall.SIGKILL) }

func (m *Mosquitto) signal(sig syscall.Signal) {
	m.mu.Lock()
	cmd, exited, stopped := m.cmd, m.exited, m.stopped
	m.stopped = true
	m.mu.Unlock()
	if cmd == nil || stopped {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Restart starts the broker again on the same port after Stop/Kill.
func (m *Mosquitto) Restart() error {
	m.Stop()
	var err error
	// The port can linger briefly after the old process exits.
	for attempt := 0; attempt < 20; attempt++ {
		if err = m.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("restart mosquitto on port %d: %w", m.port, err)
}

func (m *Mosquitto) kill() {
	m.Kill()
	if m.t.Failed() && m.log.Len() > 0 {
		m.t.Logf("mosquitto log (%s):\n%s", m.Addr(), m.Log())
	}
}

// freePort is FreePort without a testing.TB, for non-test callers.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lockedBuffer collects broker output written from the exec goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *lockedBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}
