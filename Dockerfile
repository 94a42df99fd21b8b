# tailguard image: the same CLI as docs/commands.md (`tailguard ...`), used by docker-compose.yml.
# Installed in place (editable) so that sql/, specs/ and data/ resolve next to the code,
# as they do in a checkout. Pure Python: nothing to compile.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY pipeline ./pipeline
COPY producers ./producers
COPY sql ./sql
COPY specs ./specs
COPY data ./data
RUN pip install --no-cache-dir -c constraints.txt -e '.[worker]'
ENTRYPOINT ["tailguard"]
CMD ["--help"]
