package redistest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Netns is a network namespace joined to the host's by a veth pair, with an address on each end
// in 198.18.64.0/18 (part of RFC 2544's benchmarking range 198.18.0.0/15: never a private
// network; the part the project's kind cluster does not use; a /30 that no network routed on the
// host overlaps). A server
// in it is reached at InsideIP; it reaches the host's processes at HostIP. Cut drops every packet
// on the namespace's end of the link (a partition: nothing is refused, nothing answers), Heal
// lets them through again. The `dummy` link type is missing on the machine this was built on, so
// the namespace has a veth pair of its own.
type Netns struct {
	t        testing.TB
	Name     string
	HostIP   string
	InsideIP string
	hostIf   string
	insideIf string
}

// CanNetns reports why this process cannot create a network namespace ("" when it can): that
// takes root, ip(8) and iptables(8).
func CanNetns() string {
	if os.Geteuid() != 0 {
		return "network namespaces need root"
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " is missing"
		}
	}
	return ""
}

// NewNetns creates a namespace and its link for the test (removed at its end).
func NewNetns(t testing.TB) *Netns {
	t.Helper()
	if why := CanNetns(); why != "" {
		t.Skipf("cannot create a network namespace: %s", why)
	}
	var lastErr error
	for range 5 {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		id := hex.EncodeToString(b[:3])
		// A random /30 of 198.18.64.0/18: the part of the benchmarking range that the
		// project's kind cluster leaves alone (hack/kind/lib.sh: its network 198.18.0.0/24, pods
		// 198.18.128.0/17, services 198.19.0.0/16), and clear of every network routed here.
		third, fourth := 64+int(b[1]&0x3f), int(b[2]&0xfc)
		n := &Netns{t: t, Name: "a2af-" + id, hostIf: "a2af" + id + "h", insideIf: "a2af" + id + "n",
			HostIP:   fmt.Sprintf("198.18.%d.%d", third, fourth+1),
			InsideIP: fmt.Sprintf("198.18.%d.%d", third, fourth+2)}
		if routed(net.ParseIP(n.HostIP)) || routed(net.ParseIP(n.InsideIP)) {
			lastErr = fmt.Errorf("%s/30 overlaps a routed network", n.HostIP)
			continue
		}
		if lastErr = n.create(); lastErr == nil {
			t.Cleanup(n.remove)
			return n
		}
		n.remove()
	}
	t.Fatalf("create a network namespace: %v", lastErr)
	return nil
}

// routed reports whether ip falls in a network the host already routes (other than the default
// route): a namespace there would steal another network's traffic.
func routed(ip net.IP) bool {
	out, err := exec.Command("ip", "-4", "route", "show").Output()
	if err != nil {
		return true // cannot tell: do not risk it
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] == "default" {
			continue
		}
		prefix := f[0]
		if !strings.Contains(prefix, "/") {
			prefix += "/32"
		}
		if _, nw, err := net.ParseCIDR(prefix); err == nil && nw.Contains(ip) {
			return true
		}
	}
	return false
}

func (n *Netns) create() error {
	steps := [][]string{
		{"netns", "add", n.Name},
		{"link", "add", n.hostIf, "type", "veth", "peer", "name", n.insideIf},
		{"link", "set", n.insideIf, "netns", n.Name},
		{"addr", "add", n.HostIP + "/30", "dev", n.hostIf},
		{"link", "set", n.hostIf, "up"},
		{"netns", "exec", n.Name, "ip", "addr", "add", n.InsideIP + "/30", "dev", n.insideIf},
		{"netns", "exec", n.Name, "ip", "link", "set", n.insideIf, "up"},
		{"netns", "exec", n.Name, "ip", "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	return nil
}

func (n *Netns) remove() {
	_ = exec.Command("ip", "netns", "del", n.Name).Run()
	// Removing the namespace destroys its end of the pair, and with it ours; in case it did not.
	_ = exec.Command("ip", "link", "del", n.hostIf).Run()
}

// iptables runs iptables inside the namespace (its tables are the namespace's own: the host's
// firewall is not touched).
func (n *Netns) iptables(args ...string) error {
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name, "iptables", "-w"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables %s in %s: %v: %s", strings.Join(args, " "), n.Name, err, out)
	}
	return nil
}

// Cut drops every packet in and out of the namespace's link: its servers neither answer nor
// refuse (established connections hang, new ones time out), as in a partition.
func (n *Netns) Cut() {
	n.t.Helper()
	for _, rule := range [][]string{{"-I", "INPUT", "-i", n.insideIf, "-j", "DROP"}, {"-I", "OUTPUT", "-o", n.insideIf, "-j", "DROP"}} {
		if err := n.iptables(rule...); err != nil {
			n.t.Fatal(err)
		}
	}
}

// Heal undoes Cut.
func (n *Netns) Heal() {
	n.t.Helper()
	for _, rule := range [][]string{{"-D", "INPUT", "-i", n.insideIf, "-j", "DROP"}, {"-D", "OUTPUT", "-o", n.insideIf, "-j", "DROP"}} {
		if err := n.iptables(rule...); err != nil {
			n.t.Fatal(err)
		}
	}
}
