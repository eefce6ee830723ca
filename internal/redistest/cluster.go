package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster on loopback: primaries, each with its replicas.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts primaries × (1 + replicasEach) cluster-enabled redis-servers and joins them
// with redis-cli --cluster create (Debian's redis-tools, a dependency of redis-server); it returns
// once every node reports the cluster ok and every replica is linked to its primary.
func StartCluster(t testing.TB, primaries, replicasEach int) *Cluster {
	t.Helper()
	c := &Cluster{}
	var addrs []string
	for range primaries * (1 + replicasEach) {
		dir := t.TempDir()
		n := Start(t, Options{Args: []string{"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "2000"}})
		c.Nodes = append(c.Nodes, n)
		addrs = append(addrs, n.Addr())
	}
	cli := filepath.Join(filepath.Dir(ServerBin(t)), "redis-cli")
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", fmt.Sprint(replicasEach), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, n := range c.Nodes {
		cl := redis.NewClient(&redis.Options{Addr: n.Addr()})
		for {
			info, _ := cl.ClusterInfo(ctx).Result()
			repl, _ := cl.Info(ctx, "replication").Result()
			ok := strings.Contains(info, "cluster_state:ok")
			if strings.Contains(repl, "role:slave") {
				ok = ok && strings.Contains(repl, "master_link_status:up")
			}
			if ok {
				break
			}
			select {
			case <-ctx.Done():
				_ = cl.Close()
				t.Fatalf("cluster node %s not ok after 60 s:\n%s\n%s", n.Addr(), info, repl)
			case <-time.After(100 * time.Millisecond):
			}
		}
		_ = cl.Close()
	}
	return c
}

// StoreURL is the cluster as a conversation-service store: redis+cluster://first/?addr=...
// followed by query (may be empty).
func (c *Cluster) StoreURL(query string) string {
	u := "redis+cluster://" + c.Nodes[0].Addr() + "?"
	for _, n := range c.Nodes[1:] {
		u += "addr=" + n.Addr() + "&"
	}
	return strings.TrimSuffix(u+query, "&")
}
