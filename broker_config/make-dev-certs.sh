#!/usr/bin/env bash
# Make a development CA, a server certificate, a password file and the ACL for Mosquitto.
#
#   broker_config/make-dev-certs.sh OUT_DIR [DEVICE_ID ...]
#
# Writes OUT_DIR/certs/{ca.crt,ca.key,server.crt,server.key}, OUT_DIR/passwd (one user per
# device plus "aggregator", random passwords), OUT_DIR/credentials/<user>.txt with each
# password, and OUT_DIR/acl. Point broker_config/mosquitto-prod.conf at OUT_DIR by copying it
# to /etc/mosquitto/fedstream. Server names: localhost, 127.0.0.1 and $FEDSTREAM_BROKER_HOST.
set -euo pipefail

out=${1:?usage: make-dev-certs.sh OUT_DIR [DEVICE_ID ...]}
shift
devices=("$@")
[ ${#devices[@]} -gt 0 ] || devices=(dev-0 dev-1 dev-2 dev-3)
here=$(cd "$(dirname "$0")" && pwd)
command -v openssl >/dev/null || { echo "openssl is required" >&2; exit 1; }
command -v mosquitto_passwd >/dev/null || { echo "mosquitto_passwd is required (apt-get install -y mosquitto)" >&2; exit 1; }

mkdir -p "$out/certs" "$out/credentials"
chmod 700 "$out/credentials"
cd "$out/certs"
host=${FEDSTREAM_BROKER_HOST:-localhost}
openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "/CN=fedstream dev CA" \
    -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=$host" -keyout server.key -out server.csr 2>/dev/null
printf 'subjectAltName=DNS:localhost,DNS:%s,IP:127.0.0.1\n' "$host" > san.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
    -extfile san.ext -out server.crt 2>/dev/null
rm -f server.csr san.ext ca.srl
chmod 600 ca.key server.key
cd - >/dev/null

: > "$out/passwd"
for user in "${devices[@]}" aggregator; do
    if ! [[ $user =~ ^[A-Za-z0-9_-]{1,64}$ ]]; then
        echo "bad device id: $user (must match [A-Za-z0-9_-]{1,64})" >&2; exit 1
    fi
    pw=$(openssl rand -hex 16)
    mosquitto_passwd -b "$out/passwd" "$user" "$pw"
    printf '%s\n' "$pw" > "$out/credentials/$user.txt"
done
chmod 600 "$out/passwd" "$out"/credentials/*.txt
cp "$here/acl" "$out/acl"
# Mosquitto reads these after dropping root privileges to its own user.
if [ "$(id -u)" = 0 ] && id mosquitto >/dev/null 2>&1; then
    chown -R mosquitto: "$out"
fi
echo "wrote CA, server certificate, passwd (${#devices[@]} devices + aggregator) and acl to $out"
