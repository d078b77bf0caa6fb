# Makes the agent's shared secret, /etc/sonde/secret, unless there is one: 32 random bytes as
# 64 hex digits, readable by root only (sonde.service reads it through LoadCredential=).
if [ ! -e /etc/sonde/secret ]; then
    mkdir -p /etc/sonde
    (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >/etc/sonde/secret.new \
        && mv /etc/sonde/secret.new /etc/sonde/secret)
fi
