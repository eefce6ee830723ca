package convstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// RedisJournal is the journal of several replicas. Each gated agent is owned
// by one replica at a time (a lease with a fencing token, see Acquire), which
// decides for it from memory; its commits apply only while the token still
// holds the lease, so a replica that lost an agent (paused, partitioned,
// replaced) can never overwrite what the new owner decided.
//
// Keys (P = prefix, A = agent; {A} is a Redis Cluster hash tag, so every key
// a commit touches lives in one slot):
//
//	P:{A}:c:<contextID>  hash: "h" → header record, "t:<taskID>" → task record,
//	                     "m:<seq, 16 hex>" → history item
//	P:{A}:s              set of the agent's context ids (recovery)
//	P:{A}:owner          the owner's fencing token (a lease: PX ttl)
//	P:{A}:inbox          events of the agent's tasks that another replica
//	                     received after the agent moved (the owner applies them)
//	P:{A}:handled        correlation data of the requests the previous owner
//	                     handled last (a set, expiring): the next owner drops
//	                     those it received too
//	P:agents             set of agents with stored state
//	P:replicas           zset replica id → lease expiry (ms): live replicas
//
// A group commit is one pipeline: one script call per agent in the group.
//
// With WaitReplicas set (a primary with replicas: Sentinel, a cluster's
// shards) the pipeline ends with WAIT: a group is durable once that many
// replicas acknowledged it, so a failover to one of them loses no
// acknowledged turn (docs/conversation-service.md, "Replicated Redis").
type RedisJournal struct {
	c            redis.UniversalClient
	prefix       string
	waitReplicas int
	waitTimeout  time.Duration
	g            *groupCommitter
	commits      atomic.Int64
}

// RedisJournalOptions configure a RedisJournal.
type RedisJournalOptions struct {
	// Prefix namespaces the keys ("" = "a2af").
	Prefix string
	// WaitReplicas: a group commit is durable once this many replicas
	// acknowledged it (WAIT); 0: once the primary applied it.
	WaitReplicas int
	// WaitTimeout bounds the wait for those acknowledgements (default
	// DefaultWaitTimeout); a commit with fewer fails (ErrNotReplicated).
	WaitTimeout time.Duration
}

// ErrNotReplicated: a commit was applied by the primary but not acknowledged
// by as many replicas as the journal waits for, within its timeout. It is
// not durable: a failover may lose it.
var ErrNotReplicated = errors.New("not acknowledged by enough replicas")

// NewRedisJournal returns a journal on client c, which it owns (Close closes
// it). prefix namespaces the keys ("" = "a2af").
func NewRedisJournal(c redis.UniversalClient, prefix string) *RedisJournal {
	return NewRedisJournalWith(c, RedisJournalOptions{Prefix: prefix})
}

// NewRedisJournalWith returns a journal on client c, which it owns (Close
// closes it).
func NewRedisJournalWith(c redis.UniversalClient, o RedisJournalOptions) *RedisJournal {
	if o.Prefix == "" {
		o.Prefix = "a2af"
	}
	if o.WaitTimeout <= 0 {
		o.WaitTimeout = DefaultWaitTimeout
	}
	j := &RedisJournal{c: c, prefix: o.Prefix, waitReplicas: o.WaitReplicas, waitTimeout: o.WaitTimeout}
	j.g = newGroupCommitter(j.commit)
	return j
}

func (j *RedisJournal) base(agent string) string { return j.prefix + ":{" + agent + "}:" }

// Append implements Journal.
func (j *RedisJournal) Append(changes ...Change) *Ticket { return j.g.Append(changes...) }

// commitScript applies one agent's changes if the fence holds.
// KEYS[1] owner, KEYS[2] context set, KEYS[3..] context hashes (one per
// change, in order). ARGV[1] token ("" = unfenced); then per change: op
// ("P" put, "D" delete, "C" history items only), context id, header, #puts,
// #dels, then the puts (field, data pairs) and the dels (fields).
var commitScript = redis.NewScript(`
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local i = 2
local k = 3
while i <= #ARGV do
  local op, ctx, header = ARGV[i], ARGV[i+1], ARGV[i+2]
  local np, nd = tonumber(ARGV[i+3]), tonumber(ARGV[i+4])
  local key = KEYS[k]
  i = i + 5
  k = k + 1
  if op == 'D' then
    redis.call('DEL', key)
    redis.call('SREM', KEYS[2], ctx)
    i = i + 2 * np + nd
  else
    if op == 'P' then redis.call('HSET', key, 'h', header) end
    for p = 1, np do
      redis.call('HSET', key, ARGV[i], ARGV[i+1])
      i = i + 2
    end
    for d = 1, nd do
      redis.call('HDEL', key, ARGV[i])
      i = i + 1
    end
    if op == 'P' then redis.call('SADD', KEYS[2], ctx) end
  end
end
return 1
`)

func (j *RedisJournal) commit(changes []Change) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var order []string
	byAgent := map[string][]Change{}
	for _, ch := range changes {
		if _, ok := byAgent[ch.Agent]; !ok {
			order = append(order, ch.Agent)
		}
		byAgent[ch.Agent] = append(byAgent[ch.Agent], ch)
	}
	if cc, ok := j.c.(*redis.ClusterClient); ok && j.waitReplicas > 0 {
		return j.commitPerShard(ctx, cc, order, byAgent)
	}
	if err := j.commitOn(ctx, j.c, order, byAgent, true); err != nil {
		return fmt.Errorf("commit %d conversation changes: %w", len(changes), err)
	}
	j.commits.Add(1)
	return nil
}

// commitOn runs one pipeline on c: a fenced script per agent (and the
// agents' membership of P:agents when withIndex), then WAIT when the journal
// waits for replicas. c is a primary (or a failover client's primary): WAIT
// counts the replicas that acknowledged everything this connection wrote.
func (j *RedisJournal) commitOn(ctx context.Context, c redis.Cmdable, order []string, byAgent map[string][]Change, withIndex bool) error {
	cmds := make([]*redis.Cmd, len(order))
	var wait *redis.Cmd
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for n, agent := range order {
			if withIndex {
				p.SAdd(ctx, j.prefix+":agents", agent)
			}
			cmds[n] = j.queueCommit(ctx, p, agent, byAgent[agent])
		}
		if j.waitReplicas > 0 {
			// WAIT is not among the pipeliner's typed commands.
			wait = p.Do(ctx, "wait", j.waitReplicas, j.waitTimeout.Milliseconds())
		}
		return nil
	})
	if err != nil && isNoScript(err) {
		// First use on this server (or a primary that just took over):
		// load the script, then retry once.
		if lerr := commitScript.Load(ctx, c).Err(); lerr != nil {
			return fmt.Errorf("load commit script: %w", lerr)
		}
		return j.commitOn(ctx, c, order, byAgent, withIndex)
	}
	if err != nil {
		return err
	}
	for n, cmd := range cmds {
		if v, _ := cmd.Int64(); v != 1 {
			return fmt.Errorf("commit changes of agent %s: %w (fenced off)", order[n], ErrNotOwner)
		}
	}
	if wait != nil {
		if acked, _ := wait.Int64(); acked < int64(j.waitReplicas) {
			return fmt.Errorf("acknowledged by %d replicas within %s, want %d: %w", acked, j.waitTimeout, j.waitReplicas, ErrNotReplicated)
		}
	}
	return nil
}

// commitPerShard is commit on a cluster that waits for replicas: WAIT counts
// what one connection wrote to one primary, so the group is split by the
// primary that holds each agent's slot (every key of an agent shares its hash
// tag), one pipeline with its own WAIT per primary, run concurrently. The
// agents' membership of P:agents (another slot) goes through the cluster
// client beside them; it lists agents for recovery, and a gated agent is
// known without it.
func (j *RedisJournal) commitPerShard(ctx context.Context, cc *redis.ClusterClient, order []string, byAgent map[string][]Change) error {
	shards := map[string]*redis.Client{}
	byShard := map[string][]string{}
	for _, agent := range order {
		node, err := cc.MasterForKey(ctx, j.base(agent)+"owner")
		if err != nil {
			return fmt.Errorf("commit %d agents' changes: the primary of %s: %w", len(order), agent, err)
		}
		addr := node.Options().Addr
		shards[addr] = node
		byShard[addr] = append(byShard[addr], agent)
	}
	errs := make(chan error, len(shards)+1)
	go func() { errs <- cc.SAdd(ctx, j.prefix+":agents", anySlice(order)...).Err() }()
	for addr, node := range shards {
		go func() {
			if err := j.commitOn(ctx, node, byShard[addr], byAgent, false); err != nil {
				errs <- fmt.Errorf("shard %s: %w", addr, err)
				return
			}
			errs <- nil
		}()
	}
	var all []error
	for range len(shards) + 1 {
		if err := <-errs; err != nil {
			all = append(all, err)
		}
	}
	if err := errors.Join(all...); err != nil {
		return fmt.Errorf("commit %d agents' changes: %w", len(order), err)
	}
	j.commits.Add(1)
	return nil
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// queueCommit queues agent's changes as one call of the fenced commit script.
func (j *RedisJournal) queueCommit(ctx context.Context, p redis.Pipeliner, agent string, chs []Change) *redis.Cmd {
	base := j.base(agent)
	keys := []string{base + "owner", base + "s"}
	token := ""
	if f := chs[len(chs)-1].Fence; f != nil {
		token = f.Token
	}
	args := []any{token}
	for _, ch := range chs {
		keys = append(keys, base+"c:"+ch.ContextID)
		op := "P"
		switch {
		case ch.Delete:
			op = "D"
		case ch.Header == nil:
			op = "C"
		}
		args = append(args, op, ch.ContextID, ch.Header, len(ch.Put)+len(ch.PutContent), len(ch.Del)+len(ch.DelContent))
		for _, t := range ch.Put {
			args = append(args, "t:"+t.ID, t.Data)
		}
		for _, it := range ch.PutContent {
			args = append(args, itemField(it.Seq), it.Data)
		}
		for _, id := range ch.Del {
			args = append(args, "t:"+id)
		}
		for _, seq := range ch.DelContent {
			args = append(args, itemField(seq))
		}
	}
	return commitScript.EvalSha(ctx, p, keys, args...)
}

// itemField is the hash field of a history item.
func itemField(seq uint64) string { return fmt.Sprintf("m:%016x", seq) }

func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// Load implements Journal.
func (j *RedisJournal) Load(ctx context.Context, agent string, fn func(agent string, c *conversation.Context, items []*Item) error) error {
	agents := []string{agent}
	if agent == "" {
		var err error
		if agents, err = j.c.SMembers(ctx, j.prefix+":agents").Result(); err != nil {
			return fmt.Errorf("list agents: %w", err)
		}
	}
	for _, a := range agents {
		base := j.base(a)
		ids, err := j.c.SMembers(ctx, base+"s").Result()
		if err != nil {
			return fmt.Errorf("list contexts of %s: %w", a, err)
		}
		for batch := range slices.Chunk(ids, 500) {
			cmds := make([]*redis.MapStringStringCmd, len(batch))
			if _, err := j.c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, id := range batch {
					cmds[i] = p.HGetAll(ctx, base+"c:"+id)
				}
				return nil
			}); err != nil {
				return fmt.Errorf("load contexts of %s: %w", a, err)
			}
			for i, cmd := range cmds {
				fields := cmd.Val()
				h, ok := fields["h"]
				if !ok {
					continue // deleted meanwhile
				}
				c, err := decodeHeader(batch[i], []byte(h))
				if err != nil {
					return fmt.Errorf("agent %s: %w", a, err)
				}
				var items []*Item
				for f, v := range fields {
					if hex, isItem := strings.CutPrefix(f, "m:"); isItem {
						seq, err := strconv.ParseUint(hex, 16, 64)
						if err != nil {
							return fmt.Errorf("agent %s context %s: history field %q: %w", a, c.ID, f, errRecord)
						}
						it, err := decodeItem(seq, []byte(v))
						if err != nil {
							return fmt.Errorf("agent %s context %s: %w", a, c.ID, err)
						}
						items = append(items, it)
						continue
					}
					id, isTask := strings.CutPrefix(f, "t:")
					if !isTask {
						continue
					}
					t, err := decodeTask(id, []byte(v))
					if err != nil {
						return fmt.Errorf("agent %s context %s: %w", a, c.ID, err)
					}
					c.Tasks = append(c.Tasks, t)
				}
				slices.SortFunc(c.Tasks, func(x, y *conversation.Task) int { return int(x.Seq) - int(y.Seq) })
				slices.SortFunc(items, func(x, y *Item) int { return cmp.Compare(x.Seq, y.Seq) })
				if err := fn(a, c, items); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Agents lists the agents with stored state.
func (j *RedisJournal) Agents(ctx context.Context) ([]string, error) {
	out, err := j.c.SMembers(ctx, j.prefix+":agents").Result()
	if err != nil {
		return nil, fmt.Errorf("list agents with state: %w", err)
	}
	return out, nil
}

// ForgetAgent removes an agent without contexts from the agents with
// state. Call it only as the agent's owner, once its last context is gone.
func (j *RedisJournal) ForgetAgent(ctx context.Context, agent string) error {
	if n, err := j.c.SCard(ctx, j.base(agent)+"s").Result(); err != nil || n > 0 {
		if err == nil {
			err = fmt.Errorf("agent %s still has %d contexts", agent, n)
		}
		return fmt.Errorf("forget agent: %w", err)
	}
	if err := j.c.SRem(ctx, j.prefix+":agents", agent).Err(); err != nil {
		return fmt.Errorf("forget agent %s: %w", agent, err)
	}
	return nil
}

// Ping checks that Redis answers and, when commits wait for replicas, that
// the primary (every primary of a cluster) has that many replicas online
// (readiness: without them every commit fails).
func (j *RedisJournal) Ping(ctx context.Context) error {
	if err := j.c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if j.waitReplicas == 0 {
		return nil
	}
	check := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return fmt.Errorf("redis: replication info: %w", err)
		}
		if n := onlineReplicas(info); n < j.waitReplicas {
			return fmt.Errorf("redis primary %s has %d replicas online, commits wait for %d (wait_replicas)", c.Options().Addr, n, j.waitReplicas)
		}
		return nil
	}
	switch c := j.c.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, check)
	case *redis.Client:
		return check(ctx, c)
	}
	return nil
}

// onlineReplicas counts the replicas an INFO replication section lists as
// online ("slave0:ip=...,port=...,state=online,...").
func onlineReplicas(info string) int {
	n := 0
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "slave") && strings.Contains(line, "state=online") {
			n++
		}
	}
	return n
}

// Close implements Journal.
func (j *RedisJournal) Close() error {
	j.g.close()
	if err := j.c.Close(); err != nil {
		return fmt.Errorf("close redis journal: %w", err)
	}
	return nil
}

// acquireScript takes an agent's lease if it is free, already ours, or
// (ARGV[3] set) held by an earlier incarnation of this replica: a token
// that starts with ARGV[3].
var acquireScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] and (ARGV[3] == '' or string.sub(cur, 1, #ARGV[3]) ~= ARGV[3]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
`)

// releaseScript drops the lease only if it is ours.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// Acquire takes (or renews) the lease on agent for token; false when
// another token holds it.
func (j *RedisJournal) Acquire(ctx context.Context, agent, token string, ttl time.Duration) (bool, error) {
	return j.acquire(ctx, agent, token, "", ttl)
}

// TakeOver is Acquire that also takes the lease from a token starting with
// incarnation (a replica's id and a separator: "r1/"): a replica restarted
// under the same id takes its agents back at once instead of waiting for
// the leases of its crashed previous run to lapse. Safe because replica ids
// are unique among live replicas (they are the replicas' MQTT client ids),
// and fenced: were the previous run still alive, its commits fail from now
// on and its next renewal (Acquire) finds the lease gone.
func (j *RedisJournal) TakeOver(ctx context.Context, agent, token, incarnation string, ttl time.Duration) (bool, error) {
	if incarnation == "" {
		return false, errors.New("take over a lease: empty incarnation prefix")
	}
	return j.acquire(ctx, agent, token, incarnation, ttl)
}

func (j *RedisJournal) acquire(ctx context.Context, agent, token, incarnation string, ttl time.Duration) (bool, error) {
	v, err := acquireScript.Run(ctx, j.c, []string{j.base(agent) + "owner"}, token, ttl.Milliseconds(), incarnation).Int64()
	if err != nil {
		return false, fmt.Errorf("lease on %s: %w", agent, err)
	}
	return v == 1, nil
}

// leaseBatch bounds the commands of one pipeline of RenewLeases and
// PopInboxes: a round over 10 000 agents is 20 pipelines, each answered in
// one round trip, instead of 10 000 round trips.
const leaseBatch = 512

// RenewLeases renews the leases on agents for token (Acquire for each, in
// pipelines of leaseBatch: one round trip per batch instead of one per
// agent). held[i] reports whether token still holds agents[i]'s lease.
func (j *RedisJournal) RenewLeases(ctx context.Context, agents []string, token string, ttl time.Duration) (held []bool, err error) {
	held = make([]bool, 0, len(agents))
	for batch := range slices.Chunk(agents, leaseBatch) {
		got, err := j.renewBatch(ctx, batch, token, ttl, true)
		if err != nil {
			return nil, err
		}
		held = append(held, got...)
	}
	return held, nil
}

func (j *RedisJournal) renewBatch(ctx context.Context, agents []string, token string, ttl time.Duration, loadOnce bool) ([]bool, error) {
	cmds := make([]*redis.Cmd, len(agents))
	_, err := j.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, agent := range agents {
			cmds[i] = acquireScript.EvalSha(ctx, p, []string{j.base(agent) + "owner"}, token, ttl.Milliseconds(), "")
		}
		return nil
	})
	if err != nil && isNoScript(err) && loadOnce {
		// First use on this server (or after a restart): load, retry once.
		if lerr := acquireScript.Load(ctx, j.c).Err(); lerr != nil {
			return nil, fmt.Errorf("load lease script: %w", lerr)
		}
		return j.renewBatch(ctx, agents, token, ttl, false)
	}
	if err != nil {
		return nil, fmt.Errorf("renew %d leases: %w", len(agents), err)
	}
	held := make([]bool, len(agents))
	for i, cmd := range cmds {
		v, _ := cmd.Int64()
		held[i] = v == 1
	}
	return held, nil
}

// PopInboxes takes up to n events from the inbox of each of agents (as
// PopEvents, in pipelines of leaseBatch). Agents with an empty inbox are
// left out of the result.
func (j *RedisJournal) PopInboxes(ctx context.Context, agents []string, n int) (map[string][]conversation.Event, error) {
	out := map[string][]conversation.Event{}
	for batch := range slices.Chunk(agents, leaseBatch) {
		cmds := make([]*redis.StringSliceCmd, len(batch))
		_, err := j.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, agent := range batch {
				cmds[i] = p.LPopCount(ctx, j.base(agent)+"inbox", n)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return out, fmt.Errorf("read %d inboxes: %w", len(batch), err)
		}
		for i, cmd := range cmds {
			if raw, err := cmd.Result(); err == nil && len(raw) > 0 {
				out[batch[i]] = decodeEvents(raw)
			}
		}
	}
	return out, nil
}

// ReleaseLeases gives up the leases token holds among agents (Release for
// each, in pipelines of leaseBatch): a clean shutdown hands every agent over
// in a few round trips.
func (j *RedisJournal) ReleaseLeases(ctx context.Context, agents []string, token string) error {
	for batch := range slices.Chunk(agents, leaseBatch) {
		_, err := j.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, agent := range batch {
				// Eval, not EvalSha: a shutdown has no round trip to spare for a
				// NOSCRIPT retry, and the script is short.
				releaseScript.Eval(ctx, p, []string{j.base(agent) + "owner"}, token)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("release %d leases: %w", len(batch), err)
		}
	}
	return nil
}

// Release gives the lease up if token holds it.
func (j *RedisJournal) Release(ctx context.Context, agent, token string) error {
	if err := releaseScript.Run(ctx, j.c, []string{j.base(agent) + "owner"}, token).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("release lease on %s: %w", agent, err)
	}
	return nil
}

// RecordHandled stores the correlation data of the requests a replica
// handled for agent just before it hands the agent over (Memory.Drop), for
// ttl: the next owner, which may have received the same requests while both
// consumed the agent's request topic, drops them instead of answering them
// a second time (Handled).
func (j *RedisJournal) RecordHandled(ctx context.Context, agent string, corrs [][]byte, ttl time.Duration) error {
	if len(corrs) == 0 {
		return nil
	}
	key := j.base(agent) + "handled"
	members := make([]any, len(corrs))
	for i, c := range corrs {
		members[i] = c
	}
	_, err := j.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.SAdd(ctx, key, members...)
		p.PExpire(ctx, key, ttl)
		return nil
	})
	if err != nil {
		return fmt.Errorf("record requests handled for %s: %w", agent, err)
	}
	return nil
}

// Handled returns what the previous owner of agent recorded with
// RecordHandled (nil when nothing is recorded).
func (j *RedisJournal) Handled(ctx context.Context, agent string) ([][]byte, error) {
	out, err := j.c.SMembers(ctx, j.base(agent)+"handled").Result()
	if err != nil {
		return nil, fmt.Errorf("requests handled for %s: %w", agent, err)
	}
	corrs := make([][]byte, len(out))
	for i, c := range out {
		corrs[i] = []byte(c)
	}
	return corrs, nil
}

// Heartbeat records replica as live until now+ttl and returns the live
// replicas (sorted).
func (j *RedisJournal) Heartbeat(ctx context.Context, replica string, ttl time.Duration) ([]string, error) {
	key := j.prefix + ":replicas"
	now := time.Now()
	var live *redis.StringSliceCmd
	_, err := j.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, key, redis.Z{Score: float64(now.Add(ttl).UnixMilli()), Member: replica})
		p.ZRemRangeByScore(ctx, key, "-inf", fmt.Sprint(now.UnixMilli()))
		live = p.ZRange(ctx, key, 0, -1)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("replica heartbeat: %w", err)
	}
	out := live.Val()
	slices.Sort(out)
	return out, nil
}

// Leave removes replica from the live set (clean shutdown) and tells the
// others.
func (j *RedisJournal) Leave(ctx context.Context, replica string) error {
	if err := j.c.ZRem(ctx, j.prefix+":replicas", replica).Err(); err != nil {
		return err
	}
	return j.AnnounceChange(ctx)
}

func (j *RedisJournal) changesChannel() string { return j.prefix + ":replicas:changed" }

// AnnounceChange tells every replica that the set of replicas changed (one
// joined or left), so they rebalance at once instead of at their next round.
func (j *RedisJournal) AnnounceChange(ctx context.Context) error {
	return j.c.Publish(ctx, j.changesChannel(), "1").Err()
}

// WatchChanges calls fn whenever a replica announces a change, until ctx
// ends.
func (j *RedisJournal) WatchChanges(ctx context.Context, fn func()) {
	sub := j.c.Subscribe(ctx, j.changesChannel())
	defer sub.Close()
	ch := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				return
			}
			fn()
		}
	}
}

// PushEvent hands an event of agent's task to its owner (inbox).
func (j *RedisJournal) PushEvent(ctx context.Context, agent string, ev conversation.Event) error {
	e := enc{}
	e.s(string(ev.Kind))
	e.s(ev.TaskID)
	e.s(ev.ContextID)
	e.byte(stateCode(ev.State))
	e.bytes(ev.Correlation)
	if ev.Final {
		e.byte(1)
	} else {
		e.byte(0)
	}
	if err := j.c.RPush(ctx, j.base(agent)+"inbox", e.b).Err(); err != nil {
		return fmt.Errorf("hand event of %s over: %w", agent, err)
	}
	return nil
}

// PopEvents takes up to n events from agent's inbox.
func (j *RedisJournal) PopEvents(ctx context.Context, agent string, n int) ([]conversation.Event, error) {
	raw, err := j.c.LPopCount(ctx, j.base(agent)+"inbox", n).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inbox of %s: %w", agent, err)
	}
	return decodeEvents(raw), nil
}

// decodeEvents reads inbox entries (PushEvent's encoding); an entry that does
// not decode is skipped.
func decodeEvents(raw []string) []conversation.Event {
	out := make([]conversation.Event, 0, len(raw))
	for _, r := range raw {
		d := dec{b: []byte(r)}
		ev := conversation.Event{Kind: conversation.EventKind(d.s()), TaskID: d.s(), ContextID: d.s()}
		if st := d.byte(); int(st) < len(states) {
			ev.State = states[st]
		}
		ev.Correlation = d.bytes()
		ev.Final = d.byte() == 1
		if d.err == nil {
			out = append(out, ev)
		}
	}
	return out
}
