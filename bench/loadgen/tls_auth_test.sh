#!/usr/bin/env bash
# capstan-bench against a Capstan that serves TLS with client certificates
# and has auth enabled: a short put must succeed with --cacert/--cert/--key
# and --user, and fail without --user or with a wrong password; with a token
# TTL of 1 s, a put paced slower than that must still succeed (the token is
# fetched again when the server calls it invalid).
#
#   bench/loadgen/tls_auth_test.sh BUILD_DIR
set -euo pipefail

build=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
server=$build/server/capstan
[ -x "$server" ] || server=$build/capstan
bench=$build/capstan-bench
work=$(mktemp -d /tmp/capstan-bench-tls-XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [ -f "$work/server.log" ] && tail -20 "$work/server.log" >&2; exit 1; }

# A CA, a server certificate for 127.0.0.1 and a client certificate whose
# CN is no user (so requests without a token are not authorized by it).
cd "$work"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bench-ca -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile server.ext -out server.pem 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=bench-client -keyout client.key -out client.csr 2>/dev/null
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile client.ext -out client.pem 2>/dev/null

ports=($(python3 -c 'import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))'))
client=https://127.0.0.1:${ports[0]}
peer=http://127.0.0.1:${ports[1]}
"$server" --name=bench --data-dir="$work/data" --listen-client-urls=$client --advertise-client-urls=$client \
  --listen-peer-urls=$peer --initial-advertise-peer-urls=$peer --initial-cluster=bench=$peer \
  --listen-metrics-urls=http://127.0.0.1:${ports[2]} \
  --cert-file=server.pem --key-file=server.key --trusted-ca-file=ca.pem --client-cert-auth \
  --auth-token-ttl=1 > "$work/server.log" 2>&1 &
pid=$!

tls=(--cacert=ca.pem --cert=client.pem --key=client.key)
ctl() { ETCDCTL_API=3 timeout 10 etcdctl --endpoints=$client "${tls[@]}" "$@"; }
for _ in $(seq 100); do
  ctl endpoint health >/dev/null 2>&1 && break
  sleep 0.1
done
ctl user add root:secret >/dev/null || fail "user add"
ctl auth enable >/dev/null 2>&1 || fail "auth enable"

run() { timeout 60 "$bench" --no-progress --endpoints=$client "${tls[@]}" "$@"; }

out=$(run --user=root:secret --conns=2 --clients=4 put --total=200 --key-size=8 --val-size=64) ||
  fail "put with TLS and --user failed: $out"
grep -q "Requests/sec" <<<"$out" || fail "no summary: $out"
grep -q "Total:" <<<"$out" || fail "no total: $out"

if run --conns=1 --clients=1 put --total=5 >/dev/null 2>&1; then fail "put without --user succeeded"; fi
if run --user=root:wrong --conns=1 --clients=1 put --total=5 >/dev/null 2>&1; then
  fail "put with a wrong password succeeded"
fi
# Without the CA the server's certificate cannot be verified.
if timeout 20 "$bench" --no-progress --dial-timeout=2s --endpoints=$client --user=root:secret \
    put --total=5 >/dev/null 2>&1; then
  fail "put without --cacert succeeded"
fi

# Requests 2.5 s apart outlive the 1 s token: each is rejected once and resent.
out=$(run --user=root:secret --conns=1 --clients=1 put --total=3 --rate=0.4) ||
  fail "put after the token expired failed: $out"
echo "PASS"
