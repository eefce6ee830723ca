package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// cardKeysWait bounds the wait for the retained key set: it arrives right after the SUBACK when
// there is one, so a broker without signed cards costs `agents` this much.
const cardKeysWait = 500 * time.Millisecond

// cardTrust is the trust anchor for agent cards: --card-keys, else the key set retained on the
// broker. Without either it returns nil (cards are not verified), or an error when required.
func (c *cli) cardTrust(ctx context.Context, conn *a2amqtt.Conn, required bool) (*a2amqtt.CardTrust, error) {
	if c.g.cardKeys != "" {
		return a2amqtt.CardTrustFromFile(c.g.cardKeys)
	}
	trust, err := a2amqtt.FollowCardKeys(ctx, conn, cardKeysWait)
	if err != nil {
		if required {
			return nil, fmt.Errorf("no trust anchor for agent cards (give --card-keys FILE): %w", err)
		}
		c.log.Debug("agent cards are not verified: no key set", "err", err)
		return nil, nil
	}
	return trust, nil
}

// pinCardKeys makes conn verify the cards it looks up when --card-keys is given (send and chat
// then refuse an agent whose card does not verify before they talk to it).
func (c *cli) pinCardKeys(conn *a2amqtt.Conn) error {
	if c.g.cardKeys == "" {
		return nil
	}
	trust, err := a2amqtt.CardTrustFromFile(c.g.cardKeys)
	if err != nil {
		return err
	}
	conn.TrustCards(trust)
	return nil
}

// printSignedAgents is the agents table with a SIGNATURE column (verified, unverified, invalid).
func printSignedAgents(tw *tabwriter.Writer, entries []a2amqtt.Entry) {
	fmt.Fprintln(tw, "AGENT\tSTATUS\tSOURCE\tSIGNATURE\tNAME\tDESCRIPTION")
	for _, e := range entries {
		name, desc := "", ""
		if e.Card != nil {
			name, desc = e.Card.Name, e.Card.Description
		}
		if e.CardError != nil {
			desc = e.CardError.Error()
		}
		status := e.Presence.Status
		if status == "" {
			status = "unknown"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Agent, status, e.Presence.Source, e.Signature.State, name, desc)
	}
	_ = tw.Flush()
}

// card runs `card verify ORG/UNIT/AGENT`: exit 0 when the card verifies, 1 when it is unsigned
// or invalid, 4 when there is no card.
func (c *cli) card(ctx context.Context, pos []string) int {
	if len(pos) != 2 || pos[0] != "verify" {
		return c.usageErr("card needs: verify ORG/UNIT/AGENT")
	}
	ref, err := a2amqtt.ParseAgentRef(pos[1])
	if err != nil {
		return c.usageErr(err.Error())
	}
	conn, code := c.connect(ctx, a2amqtt.AgentRef{Org: ref.Org, Unit: "cli"})
	if conn == nil {
		return code
	}
	defer closeConn(conn)
	trust, err := c.cardTrust(ctx, conn, true)
	if err != nil {
		return c.fail(exitFailure, err)
	}
	conn.TrustCards(trust)
	dir, err := a2amqtt.NewDirectory(ctx, conn, ref.DiscoveryTopic())
	if err != nil {
		return c.fail(exitFailure, err)
	}
	defer func() { _ = dir.Close(context.WithoutCancel(ctx)) }()
	wctx, cancel := context.WithTimeout(ctx, c.g.presence)
	err = dir.Wait(wctx, func(d *a2amqtt.Directory) bool { _, ok := d.Get(ref); return ok })
	cancel()
	e, ok := dir.Get(ref)
	if !ok {
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			return c.fail(exitOffline, fmt.Errorf("agent %s is not registered: no retained card on %s within %s", ref, ref.DiscoveryTopic(), c.g.presence))
		}
		return c.fail(exitFailure, err)
	}
	if c.g.json {
		out := map[string]string{"agent": ref.String(), "signature": e.Signature.State, "keyId": e.Signature.KeyID}
		if e.CardError != nil {
			out["error"] = e.CardError.Error()
		}
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
	} else if e.Signature.State == a2amqtt.CardVerified {
		fmt.Fprintf(c.stdout, "%s: verified (key %s)\n", ref, e.Signature.KeyID)
	} else {
		fmt.Fprintf(c.stdout, "%s: %s: %v\n", ref, cmpState(e.Signature.State), e.CardError)
	}
	if e.Signature.State != a2amqtt.CardVerified {
		return exitFailure
	}
	return exitOK
}

func cmpState(s string) string {
	if s == "" {
		return "unreadable"
	}
	return s
}
