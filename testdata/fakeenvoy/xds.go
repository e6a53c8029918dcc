package main

import (
	"context"
	"log"
	"maps"
	"math"
	"slices"
	"time"

	// Resource types the fake decodes for /config_dump.
	_ "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

const (
	typeCluster  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	typeListener = "type.googleapis.com/envoy.config.listener.v3.Listener"
	typeSecret   = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
)

// startXDS connects to the ADS cluster named in dynamic_resources.ads_config
// (Istio's xds-grpc), if the bootstrap has one, and keeps retrying until
// ctx ends: an absent socket is never fatal. SDS streams are started for
// the secrets the configuration names (sds.go).
func (e *envoy) startXDS(ctx context.Context) {
	ads := e.boot.GetDynamicResources().GetAdsConfig()
	if ads == nil {
		return
	}
	if name := ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName(); name != "" {
		delta := ads.GetApiType() == corev3.ApiConfigSource_DELTA_GRPC
		e.keepStreaming(ctx, name, ads, func(ctx context.Context, conn *grpc.ClientConn, received func()) error {
			ctx, cancel := context.WithCancel(ctx) // ends runADS's receiver with the stream
			defer cancel()
			if delta {
				return e.adsDelta(ctx, conn, received)
			}
			return e.adsSotW(ctx, conn, received)
		})
	}
}

// keepStreaming runs stream against the cluster's unix socket in a loop
// until ctx ends, redialling after every end with Envoy's backoff for the
// API config source src (backoff.go). stream calls received on every
// response, which resets the backoff, as GrpcStream::onReceiveMessage.
func (e *envoy) keepStreaming(ctx context.Context, cluster string, src *corev3.ApiConfigSource,
	stream func(context.Context, *grpc.ClientConn, func()) error) {
	c := staticCluster(e.boot, cluster)
	path := clusterAddress(c).GetPipe().GetPath()
	if path == "" {
		log.Printf("cluster %s: no pipe endpoint; not connecting", cluster)
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		retry := newBackoff(src)
		recv := maxReceive(src)
		for ctx.Err() == nil {
			err := func() error {
				conn, err := grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()),
					grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(recv)))
				if err != nil {
					return err
				}
				defer conn.Close()
				return stream(ctx, conn, retry.reset)
			}()
			if ctx.Err() != nil {
				return
			}
			interval := retry.next
			delay := retry.nextDelay()
			// One line per retry, as Envoy logs each stream close: the
			// tests read the backoff interval from it.
			log.Printf("cluster %s (%s): stream closed: %v; retrying in %v (backoff interval %v)", cluster, path, err, delay, interval)
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
	}()
}

// adsSotW runs Envoy's side of state-of-the-world ADS: CDS first, EDS for
// the EDS clusters, LDS once the clusters are initialised, RDS for the
// listeners' route configs; every response ACKed or NACKed (see init.go).
// On a reconnect it resubscribes with the versions it holds, as Envoy does.
func (e *envoy) adsSotW(ctx context.Context, conn *grpc.ClientConn, received func()) error {
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	nonces := map[string]string{}
	subscribed := map[string][]string{} // type URL -> names last asked for
	first := true
	request := func(typeURL string, names []string, errDetail *statuspb.Status) error {
		e.mu.Lock()
		version := e.xds.versions[typeURL]
		e.mu.Unlock()
		req := &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, VersionInfo: version, ResourceNames: names,
			ResponseNonce: nonces[typeURL], ErrorDetail: errDetail}
		if first { // set_node_on_first_message_only, as Istio's bootstrap
			req.Node, first = e.boot.GetNode(), false
		}
		subscribed[typeURL] = names
		return stream.Send(req)
	}
	ask := func(t string, names []string) error { return request(t, names, nil) }
	return runADS(ctx, e, subscribed, ask, stream.Recv, received, func(resp *discoveryv3.DiscoveryResponse) error {
		t := resp.GetTypeUrl()
		nonces[t] = resp.GetNonce()
		if _, ok := statPrefix[t]; !ok {
			// Not one of Envoy's init types (an ECDS config, say): keep and
			// ACK, unless Envoy would refuse a Wasm module in it.
			if detail := checkWasm(t, resp.GetVersionInfo(), resp.GetResources()); detail != nil {
				return request(t, subscribed[t], detail)
			}
			e.replaceAll(t, resp.GetVersionInfo(), resp.GetResources())
			return request(t, subscribed[t], nil)
		}
		detail := e.applyOrNACK(update{typeURL: t, version: resp.GetVersionInfo(), sotw: true, added: resp.GetResources()})
		return request(t, subscribed[t], detail)
	})
}

// runADS is the loop both ADS variants run: ask for the clusters and what
// the config held calls for, then hand each response to answer (which ACKs
// or NACKs it) and ask for what the new config calls for, until the stream
// ends. subscribed is what ask has asked for on this stream; received is
// told of every response (keepStreaming's backoff reset). Init may also
// move on without a response on this stream (a secret arrives over SDS,
// an initial fetch timeout passes): e.initMoved then asks for what it
// calls for (LDS once the clusters are initialised), as Envoy's server
// starts LDS from the cluster manager's initialized callback.
func runADS[R any](ctx context.Context, e *envoy, subscribed map[string][]string, ask func(typeURL string, names []string) error,
	recv func() (R, error), received func(), answer func(R) error) error {
	follow := func() error { return e.follow(subscribed, ask) }
	if err := ask(typeCluster, nil); err != nil {
		return err
	}
	if err := follow(); err != nil {
		return err
	}
	type result struct {
		resp R
		err  error
	}
	results := make(chan result)
	go func() {
		for {
			resp, err := recv()
			select {
			case results <- result{resp, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.initMoved:
		case r := <-results:
			if r.err != nil {
				return r.err
			}
			received()
			if err := answer(r.resp); err != nil {
				return err
			}
		}
		if err := follow(); err != nil {
			return err
		}
	}
}

// adsDelta is adsSotW over incremental (delta) ADS.
func (e *envoy) adsDelta(ctx context.Context, conn *grpc.ClientConn, received func()) error {
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		return err
	}
	subscribed := map[string][]string{}
	first := true
	send := func(req *discoveryv3.DeltaDiscoveryRequest) error {
		if first {
			req.Node, first = e.boot.GetNode(), false
		}
		return stream.Send(req)
	}
	// subscribe asks for a type, or changes its names, with the versions it
	// holds (Envoy's initial_resource_versions on a new stream).
	subscribe := func(typeURL string, names []string) error {
		prev, asked := subscribed[typeURL]
		req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeURL}
		if !asked {
			e.mu.Lock()
			req.InitialResourceVersions = maps.Clone(e.xds.resourceVersions[typeURL])
			e.mu.Unlock()
			req.ResourceNamesSubscribe = names
		} else {
			for _, n := range names {
				if !slices.Contains(prev, n) {
					req.ResourceNamesSubscribe = append(req.ResourceNamesSubscribe, n)
				}
			}
			for _, n := range prev {
				if !slices.Contains(names, n) {
					req.ResourceNamesUnsubscribe = append(req.ResourceNamesUnsubscribe, n)
				}
			}
		}
		subscribed[typeURL] = names
		return send(req)
	}
	return runADS(ctx, e, subscribed, subscribe, stream.Recv, received, func(resp *discoveryv3.DeltaDiscoveryResponse) error {
		t := resp.GetTypeUrl()
		u := update{typeURL: t, version: resp.GetSystemVersionInfo(), removed: resp.GetRemovedResources()}
		for _, r := range resp.GetResources() {
			u.added = append(u.added, r.GetResource())
			u.addedVersions = append(u.addedVersions, r.GetVersion())
		}
		req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: t, ResponseNonce: resp.GetNonce()}
		if _, ok := statPrefix[t]; !ok {
			var added []*anypb.Any
			for _, r := range resp.GetResources() {
				added = append(added, r.GetResource())
			}
			if req.ErrorDetail = checkWasm(t, resp.GetSystemVersionInfo(), added); req.ErrorDetail != nil {
				return send(req)
			}
			for _, r := range resp.GetResources() {
				e.record(t, r.GetName(), r.GetVersion(), decode(r.GetResource()))
			}
			for _, name := range resp.GetRemovedResources() {
				e.record(t, name, "", nil)
			}
		} else {
			req.ErrorDetail = e.applyOrNACK(u)
		}
		return send(req)
	})
}

// follow sends, through ask, the subscriptions the current config calls
// for that were not sent yet: EDS/RDS names that changed, LDS once
// clusters are ready. subscribed is what the stream asked for so far.
func (e *envoy) follow(subscribed map[string][]string, ask func(typeURL string, names []string) error) error {
	for _, t := range []string{typeEndpoint, typeListener, typeRoute, typeExtensionConfig} {
		e.mu.Lock()
		wanted := t != typeListener || e.ldsWantedLocked()
		names := e.subscriptionLocked(t)
		e.mu.Unlock()
		prev, asked := subscribed[t]
		switch {
		case !wanted, t != typeListener && len(names) == 0 && !asked:
			continue
		case asked && slices.Equal(prev, names):
			continue
		}
		if t == typeListener && !asked {
			e.armListenerTimeout()
		}
		if err := ask(t, names); err != nil {
			return err
		}
	}
	return nil
}

// applyOrNACK applies a response of one of Envoy's init types; when Envoy
// would reject it, it logs why and returns the error detail of the NACK
// (nil: an ACK).
func (e *envoy) applyOrNACK(u update) *statuspb.Status {
	err := e.apply(u)
	if err == nil {
		if u.typeURL == typeListener {
			e.reconcileRelays()
		}
		e.reconcileSecrets()
		e.announceLive()
		return nil
	}
	log.Printf("rejecting %s version %s: %v", shortType[u.typeURL], u.version, err)
	return &statuspb.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
}

// checkWasm is the NACK of an ECDS response whose Wasm code Envoy would
// not load: remote (an oci:// module Envoy cannot fetch; Istio's agent
// makes every one local first, #35), or a local file that is missing or
// not a module. nil: loadable, or not Wasm.
func checkWasm(typeURL, version string, resources []*anypb.Any) *statuspb.Status {
	for _, r := range resources {
		if err := xdsserver.CheckWasm(r, xdsserver.FileRoot{}); err != nil {
			log.Printf("rejecting %s version %s: %v", typeURL, version, err)
			return &statuspb.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
		}
	}
	return nil
}

// replaceAll records a state-of-the-world response: it replaces all
// resources of its type.
func (e *envoy) replaceAll(typeURL, version string, resources []*anypb.Any) {
	e.mu.Lock()
	delete(e.received, typeURL)
	e.mu.Unlock()
	for _, r := range resources {
		m := decode(r)
		e.record(typeURL, resourceName(m), version, m)
	}
}

// decode unpacks an Any; an unknown type is kept as the Any itself.
func decode(a *anypb.Any) proto.Message {
	if a == nil {
		return nil
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		return a
	}
	return m
}

// maxReceive is the largest xDS message Envoy takes on src: its
// envoy_grpc.max_receive_message_length, else no limit (Envoy's default,
// and Istio's bootstrap sets none). gRPC's own 4 MiB default made the
// stand-in refuse pushes Envoy takes (#33).
func maxReceive(src *corev3.ApiConfigSource) int {
	for _, g := range src.GetGrpcServices() {
		if m := g.GetEnvoyGrpc().GetMaxReceiveMessageLength(); m.GetValue() > 0 {
			return int(min(m.GetValue(), math.MaxInt32))
		}
	}
	return math.MaxInt32
}
