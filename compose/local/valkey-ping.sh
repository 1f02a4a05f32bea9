#!/bin/bash
# The local Valkey image's health check (it has no valkey-cli): PING over bash's /dev/tcp.
exec 3<>/dev/tcp/127.0.0.1/6379 && printf 'PING\r\n' >&3 && read -r -t 2 reply <&3 && [ "${reply%$'\r'}" = "+PONG" ]
