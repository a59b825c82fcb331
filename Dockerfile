# Builds the engine, the worker and the reference runtime into one small
# image; docker-compose.yml runs them against a 3-node JetStream cluster.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -o /out/ ./cmd/engine ./cmd/worker ./cmd/refruntime

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/ /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/engine"]
